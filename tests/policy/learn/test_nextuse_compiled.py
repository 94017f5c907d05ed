"""The compiled next-use order and its LRU shadow decide exactly as the per-key oracle.

Each case fits the model on the first half of a synthetic trace and replays all of it, the
second half counted, once through the replay core (``NextUseOrder``, ``Shadow``) and once
through the per-key Python tiers driven request by request: totals, every request's tokens by
outcome and the shadow's statistics must be equal, across readouts, with and without session
ids (without them, chains are found by the block walk) and at tier sizes where dead blocks,
re-ranking and switching between orders all happen.
"""

from __future__ import annotations

import pytest

from kvtier.policy.learn.split import Split
from kvtier.policy.learn.deploy import learned_factory
from kvtier.policy.learn.nextuse import Readout
from kvtier.policy.learn.nextuse_fit import fit_next_use
from kvtier.policy.learn.replay import Tiers, replay
from kvtier.policy.learn.request_signals import SignalTracker
from kvtier.policy.learn.signal_table import signal_table
from tests.policy.learn import traffic
from tests.policy.learn.oracle_nextuse import NextUseTier, replay_per_key
from tests.policy.learn.oracle_shadowed import RecencyOrder, Shadowed

CASES = {
    "agentic": (lambda: traffic.agentic(sessions=50, seed=1), Tiers(40, 120)),
    "agentic-shift": (lambda: traffic.agentic(sessions=50, seed=7, shift=True), Tiers(30, 60)),
    "mixed": (lambda: traffic.mixed(hours=0.15, seed=3), Tiers(200, 600)),
    "chat-shift": (lambda: traffic.chat(hours=0.15, seed=2, shift=True), Tiers(150, 400)),
}
READOUTS = [Readout("next_use"), Readout("next_use", q=0.9, last_block_dead=True),
            Readout("reuse_within", horizon_s=100.0, last_block_dead=True)]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    make, tiers = CASES[request.param]
    split = Split.by_count(make(), 0.5)
    model = fit_next_use(split.train)
    return split, tiers, model, signal_table(split.records, None, model.models)


def oracle_shadowed(model, readout, built):
    def build(capacity):
        tracker = SignalTracker(model.models)
        learned = lambda c: NextUseTier(c, model, readout, tracker=tracker)
        built.append(Shadowed(capacity, [("lru", RecencyOrder), ("learned", learned)],
                              observers=[tracker.observe]))
        return built[-1]
    return build


@pytest.mark.parametrize("readout", READOUTS, ids=lambda r: r.label())
def test_the_learned_order_alone_decides_as_the_oracle(case, readout):
    split, tiers, model, signals = case
    compiled = replay(split.records, tiers, learned_factory(model, readout, signals,
                                                            shadowed=False),
                      count_from=split.count_from)
    oracle = replay_per_key(split.records, tiers, lambda c: NextUseTier(c, model, readout),
                            count_from=split.count_from)
    assert compiled.result == oracle.result
    assert compiled.outcomes == oracle.outcomes
    assert compiled.result.cpu_stores_total > 0 and compiled.result.cpu_evictions_total > 0


@pytest.mark.parametrize("readout", READOUTS, ids=lambda r: r.label())
def test_the_shadowed_order_decides_and_switches_as_the_oracle(case, readout):
    split, tiers, model, signals = case
    built, expected = [], []
    factory = learned_factory(model, readout, signals)
    compiled = replay(split.records, tiers, lambda c: built.append(factory(c)) or built[-1],
                      count_from=split.count_from)
    oracle = replay_per_key(split.records, tiers, oracle_shadowed(model, readout, expected),
                            count_from=split.count_from)
    assert compiled.result == oracle.result
    assert compiled.outcomes == oracle.outcomes
    assert built[0].stats() == expected[0].stats()


def test_some_case_switches_orders_and_some_stays_with_lru():
    """The cases above exercise both ways a shadow goes (else their equality says little)."""
    switched, stayed = False, False
    for name in CASES:
        make, tiers = CASES[name]
        split = Split.by_count(make(), 0.5)
        model = fit_next_use(split.train)
        built = []
        factory = learned_factory(model, Readout("next_use"),
                                  signal_table(split.records, None, model.models))
        replay(split.records, tiers, lambda c: built.append(factory(c)) or built[-1])
        stats = built[0].stats()
        switched |= stats.switches > 0
        stayed |= stats.requests_by_mode[0] > 0
    assert switched and stayed


def test_signals_from_another_vocabulary_are_refused(case):
    split, _, model, _ = case
    other = signal_table(split.records, None, {"not-the-model's": 0})
    with pytest.raises(ValueError, match="vocabulary"):
        learned_factory(model, Readout(), other)
