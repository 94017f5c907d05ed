"""The admission x eviction pair kvtier deploys, chosen on the training period alone."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.pairs import (LEARNED_LEAD_SHRINK, MIN_GAIN, TIE, Pair, candidates,
                                       choose_pair, deployed, replay_deployed)
from kvtier.policy.learn.replay import Tiers, replay
from kvtier.policy.learn.split import Split

BT = 16


def _records(events):
    events.sort(key=lambda e: e[0])
    return [RequestRecord(request_id=f"r{i}", arrival_s=t, prompt_tokens=len(b) * BT,
                          output_tokens=4, block_hashes=tuple(b), block_size_tokens=BT)
            for i, (t, b) in enumerate(events)]


def hot_documents_in_a_flood(seed=0, n=1600):
    """Eight documents of 6 blocks asked again and again, between prompts of 6 blocks nobody
    sends twice: every victim a flood prompt leaves in the CPU tier pushes a document out."""
    rng = np.random.default_rng(seed)
    docs = [[1000 * d + i for i in range(6)] for d in range(1, 9)]
    fresh = iter(range(10**6, 10**7))
    events = []
    for i in range(n):
        blocks = (docs[int(rng.integers(8))] if rng.random() < 0.3
                  else [next(fresh) for _ in range(6)])
        events.append((float(i), blocks))
    return _records(events)


def each_prompt_asked_twice(seed=0, n=1600):
    """Every prompt comes back once, 30 to 60 requests later, and never again: a block is
    reused only on its second sighting, which a filter waiting for it throws away."""
    rng = np.random.default_rng(seed)
    fresh = iter(range(1, 10**7))
    events = []
    for i in range(n // 2):
        blocks = [next(fresh) for _ in range(4)]
        events.append((float(i), blocks))
        events.append((i + float(rng.integers(30, 60)) + 0.5, blocks))
    return _records(events)


def later_hit_ratio(split, tiers, choice):
    return replay_deployed(choice, split.records, tiers, count_from=split.count_from,
                           trace=split.trace).result.token_hit_ratio


def test_a_filter_is_chosen_where_one_time_prompts_flush_the_reused_ones():
    split = Split.by_count(hot_documents_in_a_flood(), 0.5)
    tiers = Tiers(6, 30)
    choice = choose_pair(split.train, tiers)
    assert choice.pair.admission != "all"
    assert chosen_ratio(choice) >= choice.lru_hit_ratio + MIN_GAIN
    # on the later half, which the choice never read, it still beats plain LRU
    lru = replay(split.records, tiers, "lru", count_from=split.count_from).result
    assert later_hit_ratio(split, tiers, choice) > lru.token_hit_ratio + 0.05
    # the evidence: every candidate, plain LRU first, and a sentence with the figures
    assert choice.validation[0].pair.plain_lru
    threshold = next((v.pair.threshold for v in choice.validation
                      if v.pair.admission == "learned"), None)
    assert [v.pair for v in choice.validation] == list(
        candidates(threshold, choice.readout and choice.readout.label()))
    assert f"{chosen_ratio(choice):.4f}" in choice.why and "plain LRU's" in choice.why
    assert choice.validation_requests == len(split.train) - choice.fit_requests


def test_the_gpu_cache_is_filtered_too_where_one_time_prompts_flush_it():
    """The eight documents (48 blocks) fit the GPU tier alone if the flood takes no cached
    slot there; a 6-block CPU tier cannot make up for it whatever it admits."""
    split = Split.by_count(hot_documents_in_a_flood(), 0.5)
    tiers = Tiers(48, 6)
    choice = choose_pair(split.train, tiers)
    assert choice.pair.gpu_sightings == 2
    best_cpu_only = max(v.hit_ratio for v in choice.validation if not v.pair.gpu_sightings)
    assert chosen_ratio(choice) > best_cpu_only + 0.1
    assert choice.pair.label.startswith("GPU cache on sighting 2, ")
    # on the later half the deployed pair serves what its replay with the GPU filter serves,
    # far above every block cached
    lru = replay(split.records, tiers, "lru", count_from=split.count_from).result
    assert later_hit_ratio(split, tiers, choice) == replay(
        split.records, tiers, deployed(choice, split.records, tiers, split.trace),
        count_from=split.count_from, trace=split.trace, gpu_sightings=2).result.token_hit_ratio
    assert later_hit_ratio(split, tiers, choice) > lru.token_hit_ratio + 0.15


def test_the_sighting_filter_loses_where_every_block_is_reused_on_its_second_sighting():
    split = Split.by_count(each_prompt_asked_twice(), 0.5)
    choice = choose_pair(split.train, Tiers(8, 400))
    by_pair = {v.pair: v.hit_ratio for v in choice.validation}
    assert by_pair[Pair("sightings", min_sightings=2)] < choice.lru_hit_ratio - 0.1
    assert choice.pair.admission != "sightings"


def test_plain_lru_stays_where_no_pair_serves_more():
    split = Split.by_count(each_prompt_asked_twice(), 0.5)
    choice = choose_pair(split.train, Tiers(8, 5000))  # the CPU tier holds every block
    assert choice.pair.plain_lru
    assert max(v.hit_ratio for v in choice.validation) < choice.lru_hit_ratio + MIN_GAIN
    assert choice.why.startswith("plain LRU admitting every block: none of the")


def test_the_choice_reads_nothing_after_the_training_period():
    records = hot_documents_in_a_flood(seed=1)
    split = Split.by_count(records, 0.5)
    tiers = Tiers(6, 30)
    choice = choose_pair(split.train, tiers)
    flooded = records[:split.count_from] + each_prompt_asked_twice(seed=2)[:400]
    again = choose_pair(Split.by_count(flooded, split.count_from / len(flooded)).train, tiers)
    assert again.pair == choice.pair
    assert [v.hit_ratio for v in again.validation] == [v.hit_ratio for v in choice.validation]


def test_a_filter_that_turns_bad_after_training_yields_to_plain_lru():
    import dataclasses

    from kvtier.policy.sim.policies import SightingAdmitter

    before = hot_documents_in_a_flood(n=800)
    after = [dataclasses.replace(r, request_id=f"a{i}", arrival_s=1000.0 + r.arrival_s,
                                 block_hashes=tuple(h + 10**8 for h in r.block_hashes))
             for i, r in enumerate(each_prompt_asked_twice(n=4800))]
    split = Split.by_count(before + after, 800 / 5600)
    tiers = Tiers(6, 400)
    choice = choose_pair(split.train, tiers)
    assert choice.pair.admission == "sightings"  # what the training period wanted
    lru = replay(split.records, tiers, "lru", count_from=split.count_from).result
    raw = replay(split.records, tiers, "lru", admitter=SightingAdmitter(2),
                 count_from=split.count_from).result
    assert raw.token_hit_ratio < lru.token_hit_ratio - 0.4  # the filter alone now serves none
    # behind plain LRU's shadow it loses only the window it takes to see the turn
    assert later_hit_ratio(split, tiers, choice) >= lru.token_hit_ratio - 0.01


@pytest.mark.parametrize("kwargs", [dict(admission="sightings", min_sightings=1),
                                    dict(admission="all", min_sightings=2),
                                    dict(eviction="arc")])
def test_a_pair_that_cannot_be_deployed_is_refused(kwargs):
    with pytest.raises(ValueError, match="must be one of|needs min_sightings"):
        Pair(**kwargs)


def chosen_ratio(choice) -> float:
    """The chosen pair's validation figure."""
    return next(v.hit_ratio for v in choice.validation if v.pair == choice.pair)


def test_the_gpu_filtered_pairs_are_the_ones_whose_admission_means_the_same_there():
    gpu = [p for p in candidates(0.3, "q50") if p.gpu_sightings]
    assert {(p.admission, p.min_sightings, p.eviction) for p in gpu} == {
        ("all", 0, "lru"), ("sightings", 3, "lru"), ("all", 0, "next-use"),
        ("sightings", 3, "next-use")}
    assert all(p.gpu_sightings == 2 for p in gpu)
    plain = [p for p in candidates(0.3, "q50") if not p.gpu_sightings]
    assert candidates(0.3, "q50")[:len(plain)] == tuple(plain)  # the GPU-filtered ones last


def _validated(*figures):
    """Validation figures for plain LRU, the CPU sighting filter, the GPU filter and the
    next-use order (the last learned), in the order :func:`candidates` gives them."""
    from kvtier.policy.learn.pairs import Validated

    pairs = (Pair(), Pair("sightings", min_sightings=2), Pair(gpu_sightings=2),
             Pair("all", "next-use", readout="next_use q=0.5"))
    return [Validated(p, h) for p, h in zip(pairs, figures)]


LRU = 0.2
BELOW, ABOVE = LEARNED_LEAD_SHRINK - 0.001, LEARNED_LEAD_SHRINK + 0.001
FIXED_TIE = LRU + MIN_GAIN / 2  # serves more than plain LRU, not enough to be chosen


@pytest.mark.parametrize("figures, chosen, measured_against", [
    ((LRU, 0.21, 0.23, 0.23 + BELOW), 2, 2),     # the order leads the GPU filter, not enough
    ((LRU, 0.21, 0.23, 0.23 + ABOVE), 3, 2),     # by more: the order
    ((LRU, LRU, FIXED_TIE, LRU + BELOW), 0, 0),  # no fixed rule clears plain LRU, nor the order
    # the order clears plain LRU by the margin, the GPU filter (not chosen) by less: the
    # margin is measured against the pair the choice would otherwise make, plain LRU
    ((LRU, LRU, FIXED_TIE, LRU + ABOVE), 3, 0),
    ((LRU, 0.23, 0.23 + TIE / 2, 0.23), 1, 1),    # the simpler fixed rule within the tie
])
def test_a_learned_pair_must_lead_the_pair_chosen_without_one_by_the_shrink(
        figures, chosen, measured_against):
    from kvtier.policy.learn.pairs import _best, _why

    scored = _validated(*figures)
    best, simple = _best(scored)
    assert best is scored[chosen] and simple is scored[measured_against]
    why = _why(best, simple, scored, 100)
    learned = scored[3]
    if chosen == 3:
        assert f"points above {simple.pair.label}, chosen among the pairs with nothing" in why
    elif learned.hit_ratio > best.hit_ratio:  # a learned pair led, not by enough: named
        named = f"the best learned pair, {learned.pair.label}, served {learned.hit_ratio:.4f}"
        assert named in why


def test_the_pairs_of_one_choice_share_what_their_fitted_parts_read(monkeypatch):
    """Deploying every pair of a choice on the same records works out the next-use order's
    signal table and the learned admission's offer scores once, and the replays are those
    of each pair deployed on its own."""
    import dataclasses

    from kvtier.policy.learn import pairs
    from tests.policy.learn import traffic

    records = traffic.mixed(hours=0.2, seed=4)
    split = Split.by_count(records, 0.5)
    tiers = Tiers(300, 800)
    choice = choose_pair(split.train, tiers)
    assert choice.next_use is not None and choice.admission_model is not None
    each = [dataclasses.replace(choice, pair=v.pair) for v in choice.validation]
    alone = [replay_deployed(c, split.records, tiers, count_from=split.count_from).result
             for c in each]
    calls = {"signal_table": 0, "score_offers": 0}

    def counted(name):
        real = getattr(pairs, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    for name in calls:
        monkeypatch.setattr(pairs, name, counted(name))
    inputs = pairs.FittedInputs(choice, split.records, tiers)
    shared = [replay_deployed(c, split.records, tiers, count_from=split.count_from,
                              inputs=inputs).result for c in each]
    assert shared == alone
    assert calls == {"signal_table": 1, "score_offers": 1}
    learned = next(c for c in each if c.pair.learned_part)
    with pytest.raises(ValueError, match="other records or tier sizes"):
        deployed(learned, split.records[:10], tiers, inputs=inputs)


def test_a_pair_that_turns_worse_than_the_simple_rule_yields_to_it(monkeypatch):
    """Chat and documents whose mix shifts at the end of the training period (GPU 500 / CPU
    2,000 blocks): the pair chosen before the shift (the next-use order admitting every block)
    falls below the simple rule (LRU admitting a block on its second request) on later
    traffic behind plain LRU's shadow alone; with the simple rule's ghost beside LRU's, the
    tier follows it where it leads and ends not below it."""
    from kvtier.policy.learn import pairs
    from kvtier.policy.sim.policies import SightingAdmitter
    from kvtier.policy.sim.trace import strip_blocks
    from tests.policy.learn import traffic

    records, trace = strip_blocks(traffic.mixed(hours=0.5, seed=0, shift=True))
    split = Split.by_count(records, 0.5).with_traces(trace)
    tiers = Tiers(500, 2000)
    choice = choose_pair(split.train, tiers, trace=split.train_trace)
    assert not choice.pair.plain_lru and choice.pair != pairs.SIMPLE_RULE
    assert pairs.shadows_simple_rule(choice.pair)

    def later(**kwargs):
        return replay(split.records, tiers, "lru", count_from=split.count_from,
                      trace=split.trace, **kwargs).result.token_hit_ratio

    lru, simple = later(), later(admitter=SightingAdmitter(2))
    assert simple > lru + 0.01  # after the shift the simple rule leads plain LRU
    built = []
    shadowed = replay_deployed(choice, split.records, tiers, count_from=split.count_from,
                               trace=split.trace, built=built).result.token_hit_ratio
    stats = built[-1].stats()
    assert stats.names[1] == pairs.SIMPLE_RULE.label and stats.requests_by_mode[1] > 0
    assert shadowed >= simple - 0.001 and shadowed > lru
    monkeypatch.setattr(pairs, "shadows_simple_rule", lambda pair: False)
    alone = later_hit_ratio(split, tiers, choice)  # behind plain LRU's shadow only
    assert alone < simple - 0.005


def test_the_ghosts_a_deployed_pair_runs_behind():
    """Each pair of a fitted choice, deployed: the simple rule's ghost beside plain LRU's only
    where the pair admits every block in the next-use order with the GPU cache unfiltered."""
    import dataclasses

    from kvtier.policy.learn import pairs
    from tests.policy.learn import traffic

    records = traffic.mixed(hours=0.2, seed=4)
    tiers = Tiers(300, 800)
    choice = choose_pair(Split.by_count(records, 0.5).train, tiers)
    readout = choice.readout.label()
    simple = ("lru", pairs.SIMPLE_RULE.label)
    for pair, ghosts in [
            (Pair("all", "next-use", readout=readout), simple),
            (Pair("learned", "next-use", threshold=0.2, readout=readout), ("lru",)),  # filters
            (Pair("sightings", min_sightings=3), ("lru",)),  # a filter already
            (pairs.SIMPLE_RULE, ("lru",)),  # the simple rule itself
            (Pair("all", "next-use", readout=readout, gpu_sightings=2), ("lru",))]:  # moot
        deployed_pair = dataclasses.replace(choice, pair=pair)
        tier = deployed(deployed_pair, records, tiers)(tiers.cpu_blocks)
        assert tier.names == (*ghosts, pair.label), pair
        assert pairs.shadows_simple_rule(pair) == (ghosts == simple)
    assert deployed(dataclasses.replace(choice, pair=Pair()), records, tiers) == "lru"
