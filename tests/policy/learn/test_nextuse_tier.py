"""The learned next-use tier: what it evicts first, and that it beats LRU where it should.

The hand-made cases run on the compiled order (driven per key: block ids are the hashes) and
on the per-key oracle, so both are held to the rules themselves, not only to each other."""

import pytest

from kvtier.policy.learn.split import Split
from kvtier.policy.learn.deploy import learned_factory
from kvtier.policy.learn.nextuse import GapTable, NextUseModel, Readout, RunningTable
from kvtier.policy.learn.nextuse_fit import fit_next_use
from kvtier.policy.learn.nextuse_tier import compiled_order, compiled_signals
from kvtier.policy.learn.replay import Tiers, replay
from kvtier.policy.learn.signal_table import signal_table
from tests.policy.learn import traffic
from tests.policy.learn.oracle_nextuse import NextUseTier
from tests.policy.learn.synthetic import record


class Compiled:
    """The core's order with the per-key face of the oracle, for requests known up front."""

    def __init__(self, capacity, model, readout, records):
        self.signals = compiled_signals(signal_table(records, None, model.models), model)
        self.order = compiled_order(capacity, model, readout, self.signals)

    def observe_request(self, index, record, blocks):
        self.signals.py_before(index, blocks)

    def insert(self, key):
        return self.order.py_insert(key)

    def remove(self, key):
        self.order.py_remove(key)

    def evict(self, n):
        return self.order.py_evict(n)

    def __iter__(self):
        return iter(self.order.py_members())

    def __len__(self):
        return self.order.size


def tier_of(kind, capacity, model, readout, records):
    if kind == "oracle":
        return NextUseTier(capacity, model, readout)
    return Compiled(capacity, model, readout, records)


KINDS = ["compiled", "oracle"]


def hand_model():
    """After a tool call the agent is back in 10 s, after the end of a turn in 1,000 s."""
    fast = GapTable.of([10.0] * 20, never=0)
    slow = GapTable.of([1000.0] * 20, never=0)
    return NextUseModel({"*": fast, "tool_use": fast, "end_turn": slow},
                        RunningTable((), ()), None, None, None, {})


def request(i, blocks, stop, session, t=0.0):
    return record(i, blocks, t=t, session_id=session, finish_status="stopped", stop_reason=stop)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("readout", [Readout("next_use"), Readout("reuse_within", horizon_s=60)])
def test_the_chain_that_comes_back_last_goes_first_tail_first(readout, kind):
    waiting = request(0, (1, 2, 3), "end_turn", "a")
    working = request(1, (11, 12, 13), "tool_use", "b", t=1.0)
    tier = tier_of(kind, 4, hand_model(), readout, [waiting, working])
    for i, r in enumerate((waiting, working)):
        tier.observe_request(i, r, r.block_hashes)
    victims = [v for h in (1, 2, 11, 12, 13) for v in tier.insert(h)]
    assert victims == [2]            # the person's turn: its deepest block first
    assert tier.insert(3) == [3]     # a tail whose head is gone is not taken in at its cost
    assert sorted(tier) == [1, 11, 12, 13]


@pytest.mark.parametrize("kind", KINDS)
def test_a_group_goes_deepest_first_through_removals_and_returns(kind):
    import random

    rng = random.Random(5)
    blocks = tuple(range(100, 160))
    one = request(0, blocks, "end_turn", "a")
    tier = tier_of(kind, None, hand_model(), Readout(), [one])
    tier.observe_request(0, one, one.block_hashes)
    held = set()
    for _ in range(600):  # insert, promote (remove) and evict at random, checked against max()
        key = rng.choice(blocks)
        action = rng.random()
        if action < 0.5:
            tier.insert(key)
            held.add(key)
        elif action < 0.75 and key in held:
            tier.remove(key)
            held.discard(key)
        elif held:
            deepest = max(held)  # positions follow the hashes here
            assert tier.evict(1) == [deepest]
            held.discard(deepest)
        assert sorted(tier) == sorted(held)


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_the_chain_moved_on_without_go_before_any_live_chain(kind):
    old = request(0, (1, 2, 3), "tool_use", "a")
    new = request(1, (1, 9), "tool_use", "a", t=1.0)     # compaction: 2 and 3 not re-sent
    live = request(2, (20, 21), "end_turn", "b", t=2.0)
    tier = tier_of(kind, 3, hand_model(), Readout(), [old, new, live])
    for i, r in enumerate((old,)):
        tier.observe_request(i, r, r.block_hashes)
    tier.insert(2)
    tier.insert(3)
    for i, r in enumerate((new, live), start=1):
        tier.observe_request(i, r, r.block_hashes)
    assert tier.insert(20) == [] and tier.insert(21) == [3]
    assert tier.evict(1) == [2] and tier.evict(5) is None and len(tier) == 2


def test_learned_order_beats_lru_on_agentic_traffic_it_was_trained_on_the_start_of():
    records = traffic.agentic(sessions=80, seed=2)
    split = Split.by_count(records, 0.5)
    model = fit_next_use(split.train)
    tiers = Tiers(60, 150)
    lru = replay(split.records, tiers, "lru", count_from=split.count_from).result
    signals = signal_table(split.records, None, model.models)
    learned = replay(split.records, tiers,
                     learned_factory(model, Readout("next_use"), signals, shadowed=False),
                     count_from=split.count_from).result
    assert learned.token_hit_ratio > lru.token_hit_ratio + 0.02
    assert learned.cpu_stores_total > 0
