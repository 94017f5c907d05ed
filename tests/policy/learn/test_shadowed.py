"""The shadowed tier: its LRU ghost is exact, and it yields to LRU when its order is behind.

The rule is checked on the compiled tier where the core has the orders (LRU, the learned
next-use order) and on the per-key oracle where a test needs an order of its own (one that
is bad on purpose)."""

import pytest

from kvtier.policy.learn.split import Split
from kvtier.policy.learn.deploy import learned_factory
from kvtier.policy.learn.kernels import kernels
from kvtier.policy.learn.nextuse import Readout
from kvtier.policy.learn.nextuse_fit import fit_next_use
from kvtier.policy.learn.replay import Tiers, replay
from kvtier.policy.learn.shadowed import Shadowed
from kvtier.policy.learn.signal_table import signal_table
from kvtier.policy.sim.compiled import core
from tests.policy.learn import traffic
from tests.policy.learn.oracle_nextuse import replay_per_key
from tests.policy.learn.oracle_shadowed import RecencyOrder
from tests.policy.learn.oracle_shadowed import Shadowed as PerKeyShadowed


class NewestFirst(RecencyOrder):
    """A bad order on purpose: evicts the block stored last."""

    def insert(self, key, info=None):
        self._order[key] = None
        victims = []
        while self.capacity_blocks is not None and len(self._order) > self.capacity_blocks:
            self._order.popitem(last=True)
            victims.append(key)
        return victims

    def pop_victim(self):
        return self._order.popitem(last=True)[0]


def hit(records, tiers, policy, split):
    return replay(records, tiers, policy, count_from=split.count_from).result.token_hit_ratio


@pytest.mark.parametrize("kind", ["compiled", "oracle"])
def test_the_lru_ghost_counts_exactly_what_lru_serves(kind):
    records = traffic.mixed(hours=0.2, seed=4)
    tiers = Tiers(300, 800)
    built = []
    if kind == "compiled":
        shadowed = lambda c: built.append(Shadowed(c, [("lru", core().Lru),
                                                       ("lru-too", core().Lru)])) or built[-1]
        again = replay(records, tiers, shadowed)
    else:
        shadowed = lambda c: built.append(PerKeyShadowed(
            c, [("lru", RecencyOrder), ("lru-too", RecencyOrder)])) or built[-1]
        again = replay_per_key(records, tiers, shadowed)
    lru = replay(records, tiers, "lru")
    assert again.result == lru.result
    stats = built[0].stats()
    assert stats.ghost_tokens == (lru.result.cpu_promotion_tokens,) * 2
    assert stats.real_tokens == lru.result.cpu_promotion_tokens


def test_a_bad_order_behind_the_shadow_stays_with_lru():
    records = traffic.chat(hours=0.3, seed=5)
    split = Split.by_time(records, 0.5)
    tiers = Tiers(300, 1500)
    lru = hit(records, tiers, "lru", split)
    bad = hit(records, tiers, NewestFirst, split)
    built = []
    safe = replay_per_key(records, tiers, lambda c: built.append(PerKeyShadowed(
        c, [("lru", RecencyOrder), ("newest-first", NewestFirst)])) or built[-1],
        count_from=split.count_from).result.token_hit_ratio
    assert bad < lru - 0.01            # the order alone loses
    assert safe >= lru - 0.005         # behind its shadow it does not
    assert built[0].stats().requests_by_mode[0] > 0.75 * len(records)  # mostly in LRU order


def test_the_learned_order_trained_before_a_shift_is_kept_safe_after_it():
    # documents stop being asked again half way through: what the model learned is now wrong
    records = traffic.mixed(hours=0.5, seed=0, shift=True)
    split = Split.by_time(records, 0.5)
    model = fit_next_use(split.train)
    tiers = Tiers(1000, 8000)
    readout = Readout("reuse_within", horizon_s=100.0, last_block_dead=True)
    signals = signal_table(split.records, None, model.models)
    lru = hit(split.records, tiers, "lru", split)
    raw = hit(split.records, tiers, learned_factory(model, readout, signals, shadowed=False),
              split)
    safe = hit(split.records, tiers, learned_factory(model, readout, signals), split)
    assert raw < lru - 0.01            # the shift turned the learned order against the traffic
    assert safe >= lru - 0.005         # behind its shadow it is not below LRU


def test_a_candidates_admitter_runs_in_the_core_as_in_the_oracle():
    from kvtier.policy.sim.policies import SightingAdmitter
    from tests.policy.sim.oracle import SightingAdmitter as OracleSightings

    from tests.policy.learn.test_pairs import hot_documents_in_a_flood

    records = hot_documents_in_a_flood(n=1000)  # the filter keeps the documents in
    tiers = Tiers(6, 30)
    built = []
    compiled = replay(records, tiers, lambda c: built.append(Shadowed(
        c, [("lru", core().Lru), ("sightings-2", core().Lru, SightingAdmitter(2))],
        window_requests=50)) or built[-1])
    per_key = replay_per_key(records, tiers, lambda c: built.append(PerKeyShadowed(
        c, [("lru", RecencyOrder), ("sightings-2", RecencyOrder, OracleSightings(2))],
        window_requests=50)) or built[-1])
    assert compiled.result == per_key.result
    assert built[0].stats() == built[1].stats()
    assert built[0].stats().requests_by_mode[1] > 0  # the filter was followed, so refused
    assert compiled.result.token_hit_ratio > replay(records, tiers, "lru").result.token_hit_ratio


class AdmitsNothing:
    """A filter gone bad: refuses every block."""

    name, reads_info = "nothing", False

    def admit(self, key, info):
        return False


def test_a_filter_gone_bad_is_dropped_like_a_bad_order():
    records = traffic.chat(hours=0.3, seed=5)
    split = Split.by_time(records, 0.5)
    tiers = Tiers(300, 1500)
    lru = hit(records, tiers, "lru", split)
    built = []
    safe = replay_per_key(records, tiers, lambda c: built.append(PerKeyShadowed(
        c, [("lru", RecencyOrder), ("nothing", RecencyOrder, AdmitsNothing())])) or built[-1],
        count_from=split.count_from).result.token_hit_ratio
    assert safe == lru                 # its ghost never serves, so it is never followed
    assert built[0].stats().requests_by_mode[1] == 0


def test_shadowed_needs_a_baseline_and_a_candidate():
    with pytest.raises(ValueError, match="baseline and at least one candidate"):
        Shadowed(10, [("lru", core().Lru)])
    with pytest.raises(ValueError, match="compiled tiers"):
        kernels().Shadow(10, [core().Lru(10), RecencyOrder(10)], [core().Lru(None)] * 2, None)
