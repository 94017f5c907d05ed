"""The compiled learned-policy pieces against their pure-Python references: the offer log
with its feature rows and Belady labels, the learned and oracle admitters (chained or not),
and learned retention's order, on synthetic conversations with request signals."""

import dataclasses
import math
import random

import numpy as np
import pytest

from kvtier.policy.learn.baselines.oracle_reused import ReusedLaterAdmitter
from kvtier.policy.learn.offers import collect_offers
from kvtier.policy.learn.replay import IndexedAdmitter, Tiers, replay
from kvtier.policy.learn.retention import LearnedRetention, factory
from tests.policy.learn.oracle_offers import collect_offers as oracle_offers
from tests.policy.learn.oracle_offers import oracle_replay
from tests.policy.learn.synthetic import conversations
from tests.policy.sim.oracle import LRU

SIZES = [(5, 10), (20, 60), (40, 15)]


def with_signals(records, rng):
    """Turns, sessions, sub-agent calls, partial last blocks and how (and how long after
    arrival) each request ended, so every feature varies."""
    return [dataclasses.replace(r, turn=rng.choice([None, 1, 2, 5]),
                                session_id=rng.choice([None, "a", "b", "c"]),
                                request_type=rng.choice([None, "subagent", "main"]),
                                prompt_tokens=max(1, r.prompt_tokens - rng.randrange(16)),
                                finish_status=rng.choice([None, "stopped", "length"]),
                                stop_reason=rng.choice([None, "tool_use", "end_turn"]),
                                e2e_latency_s=rng.choice([None, 0.5, 3.0, 20.0]))
            for r in records]


def trace(seed):
    return with_signals(conversations(400, seed=seed), random.Random(seed))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("label", [True, False])
def test_offers_equal_the_python_recorder_row_for_row(seed, label):
    records = trace(seed)
    for gpu, cpu in SIZES:
        ours, theirs = (collect_offers(records, gpu, cpu, label=label),
                        oracle_offers(records, gpu, cpu, label=label))
        assert np.array_equal(ours.X, theirs.X)  # bit for bit
        assert np.array_equal(ours.y, theirs.y)
        assert np.array_equal(ours.request_index, theirs.request_index)
        assert np.array_equal(ours.keys, theirs.keys)


def random_scores(records, gpu, cpu, rng):
    offers = oracle_offers(records, gpu, cpu, label=False)
    return {(int(i), int(k)): rng.random() for i, k in zip(offers.request_index, offers.keys)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_learned_admission_equals_the_python_admitter(seed):
    records, rng = trace(seed), random.Random(seed)
    for gpu, cpu in SIZES:
        scores = random_scores(records, gpu, cpu, rng)
        for threshold in (0.0, 0.3, 0.7):
            for chained in (True, False):
                ours = IndexedAdmitter(scores, threshold, chained=chained)
                theirs = IndexedAdmitter(scores, threshold, chained=chained)
                got = replay(records, Tiers(gpu, cpu), "lru", admitter=ours).result
                assert got == oracle_replay(records, Tiers(gpu, cpu), LRU(cpu), theirs)
                assert ours.misses == theirs.misses


@pytest.mark.parametrize("seed", [1, 2])
def test_the_reused_later_oracle_equals_the_python_admitter(seed):
    records = trace(seed)
    for gpu, cpu in SIZES:
        got = replay(records, Tiers(gpu, cpu), "lru", admitter=ReusedLaterAdmitter(records))
        assert got.result == oracle_replay(records, Tiers(gpu, cpu), LRU(cpu),
                                           ReusedLaterAdmitter(records))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_learned_retention_equals_the_python_policy(seed):
    records, rng = trace(seed), random.Random(seed)
    for gpu, cpu in SIZES:
        scores = random_scores(records, gpu, cpu, rng)
        for tau in (10.0, 100.0, math.inf):
            got = replay(records, Tiers(gpu, cpu), factory(scores, tau)).result
            assert got == oracle_replay(records, Tiers(gpu, cpu),
                                        LearnedRetention(cpu, scores, tau))


def test_a_python_policy_without_a_compiled_form_still_replays():
    """A CPU policy written in Python runs through the core's adapter, fed record by record."""

    class Observed(LRU):
        seen = 0

        def observe(self, index, record):
            self.seen += 1

    policy = Observed(10)
    records = trace(5)
    got = replay(records, Tiers(5, 10), lambda capacity: policy)
    assert policy.seen == len(records)
    assert got.result == oracle_replay(records, Tiers(5, 10), LRU(10))


def test_evaluate_on_stripped_records_and_their_trace_equals_evaluate_on_records():
    from kvtier.policy.learn.compare import compare
    from kvtier.policy.learn.split import Split
    from kvtier.policy.sim.trace import strip_blocks

    records = trace(7)
    light, blocks = strip_blocks(records)
    policies = ["lru", "belady", "learned", "learned-retention", "oracle-reused"]
    on_records = compare(Split.by_count(records, 0.5), Tiers(20, 60), policies)
    on_arrays = compare(Split.by_count(light, 0.5).with_traces(blocks), Tiers(20, 60), policies)
    assert on_arrays == on_records


def test_a_row_cap_keeps_every_kth_offer_with_its_label():
    records = trace(8)
    full = collect_offers(records, 20, 60, label=True)
    refs = sum(len(r.block_hashes) for r in records)
    capped = collect_offers(records, 20, 60, label=True, max_rows=refs // 3)
    k = -(-refs // (refs // 3))
    assert k == 4 and len(capped) == len(full.y[::k])
    for ours, theirs in ((capped.X, full.X[::k]), (capped.y, full.y[::k]),
                         (capped.request_index, full.request_index[::k]),
                         (capped.keys, full.keys[::k])):
        assert np.array_equal(ours, theirs)


def test_streamed_scores_are_the_scores_of_every_offer():
    from kvtier.policy.learn.offers import score_offers_streamed

    records = trace(9)
    offers = collect_offers(records, 20, 60, label=False)
    scores = score_offers_streamed(records, 20, 60, lambda X: X[:, 0] / 10.0, chunk_rows=100)
    expected = {(int(i), int(k)): float(x) / 10.0
                for i, k, x in zip(offers.request_index, offers.keys, offers.X[:, 0])}
    assert dict(zip(scores, (scores[k] for k in scores))) == expected
    assert len(scores) == len(expected)
    got = replay(records, Tiers(20, 60), "lru", admitter=IndexedAdmitter(scores, 0.2)).result
    assert got == replay(records, Tiers(20, 60), "lru",
                         admitter=IndexedAdmitter(expected, 0.2)).result
