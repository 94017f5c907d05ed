"""The simulator: prefix-contiguous accounting, tier flows, oracles and the Belady bound."""

import pytest
from tests.policy.sim.simtools import measured, random_prefix_trace, request

from kvtier.collector.events import Outcome
from kvtier.policy.readers import MooncakeReader
from kvtier.policy.sim.config import PriorityRule, SimConfig
from kvtier.policy.sim.policies import POLICIES
from kvtier.policy.sim.simulator import Simulator, next_use_indices, simulate

ONLINE = [name for name, spec in POLICIES.items() if not spec.uses_future]


def reference_lru_prefix_hits(records, capacity):
    """An independent single-tier LRU: a plain list, most recent last, lookup-then-touch."""
    cache, hits = [], 0
    for record in records:
        k = 0
        for h in record.block_hashes:
            if h not in cache:
                break
            k += 1
        hits += k
        for h in record.block_hashes:
            if h in cache:
                cache.remove(h)
            cache.append(h)
            if len(cache) > capacity:
                cache.pop(0)
    return hits


@pytest.mark.parametrize("capacity", [1, 5, 20, 60])
@pytest.mark.parametrize("seed", [1, 2])
def test_single_tier_lru_matches_an_independent_implementation(seed, capacity):
    records = random_prefix_trace(seed)
    result = simulate(records, SimConfig(gpu_blocks=capacity))
    assert result.gpu_hit_blocks == reference_lru_prefix_hits(records, capacity)


def test_mooncake_unlimited_capacity_matches_the_regression_facts(mooncake_path):
    result = simulate(MooncakeReader(mooncake_path).requests(), SimConfig(gpu_blocks=None))
    assert result.requests == 12031 and result.block_refs == 288500
    assert result.token_hit_ratio == pytest.approx(0.3736, abs=0.001)
    assert result.block_hit_ratio == pytest.approx(0.3664, abs=0.001)


@pytest.mark.parametrize("seed", [3, 4, 5])
@pytest.mark.parametrize("capacity", [4, 15, 40])
def test_belady_is_never_below_an_online_policy(seed, capacity):
    records = random_prefix_trace(seed)
    best = simulate(records, SimConfig(gpu_blocks=capacity, policy="belady")).gpu_hit_blocks
    for name in ONLINE:
        assert best >= simulate(records, SimConfig(gpu_blocks=capacity, policy=name)).gpu_hit_blocks


def test_belady_bounds_online_policies_on_the_real_trace(mooncake_path):
    records = list(MooncakeReader(mooncake_path).requests())
    best = simulate(records, SimConfig(gpu_blocks=2000, policy="belady")).gpu_hit_blocks
    for name in ONLINE:
        assert best > simulate(records, SimConfig(gpu_blocks=2000, policy=name)).gpu_hit_blocks


def test_next_use_indices():
    records = [request([1, 2]), request([1, 3]), request([2])]
    assert next_use_indices(records) == [2, 4, float("inf"), float("inf"), float("inf")]


def test_reuse_stops_at_the_first_missing_block():
    sim = Simulator(SimConfig(gpu_blocks=10))
    sim.serve(request([1, 2, 3]))
    outcome = sim.serve(request([1, 9, 3]))
    assert outcome.outcomes == (Outcome.GPU_HIT, Outcome.RECOMPUTE_MISS, Outcome.RECOMPUTE_MISS)


def test_tokens_count_the_partial_last_block_and_the_unhashed_tail():
    sim = Simulator(SimConfig(gpu_blocks=10))
    sim.serve(request([1, 2], prompt_tokens=6))
    again = sim.serve(request([1, 2], prompt_tokens=6))
    assert (again.gpu_hit_tokens, again.recompute_tokens) == (6, 0)
    tail = sim.serve(request([1, 2], prompt_tokens=11))  # 3 tokens past the last full block
    assert (tail.gpu_hit_tokens, tail.recompute_tokens) == (8, 3)


def test_exclusive_victims_move_down_and_hits_move_up():
    sim = Simulator(SimConfig(gpu_blocks=2, cpu_blocks=2, cold_blocks=2))
    sim.serve(request([1, 2]))
    sim.serve(request([3, 4]))                     # 1, 2 demoted to CPU
    assert set(sim.flow.cpu) == {1, 2}
    sim.serve(request([5, 6]))                     # 1, 2 to cold; 3, 4 to CPU
    assert set(sim.flow.cold) == {1, 2}
    back = sim.serve(request([1, 2]))
    assert back.outcomes == (Outcome.COLD_PROMOTION,) * 2
    assert set(sim.flow.gpu) == {1, 2} and 1 not in sim.flow.cold
    assert sim.result.cold_promotion_tokens == 8


def test_exclusive_cold_victims_leave_the_stack():
    sim = Simulator(SimConfig(gpu_blocks=1, cpu_blocks=1, cold_blocks=1))
    for h in (1, 2, 3, 4):
        sim.serve(request([h]))
    assert (set(sim.flow.gpu), set(sim.flow.cpu), set(sim.flow.cold)) == ({4}, {3}, {2})
    assert sim.result.drops_total == 1 and sim.result.cold_evictions_total == 1
    assert sim.serve(request([1])).outcomes == (Outcome.RECOMPUTE_MISS,)


def test_trtllm_offloads_only_priorities_passing_the_gate():
    rule = PriorityRule(default_priority=20, prefix_blocks=1, prefix_priority=30)
    for comparison, offloaded in (("ge", {1}), ("gt", set())):
        config = SimConfig(gpu_blocks=2, cpu_blocks=4, semantics="trtllm", priorities=rule,
                           offload_comparison=comparison)
        sim = Simulator(config)
        sim.serve(request([1, 2]))
        sim.serve(request([3, 4]))                 # evicts 1 (priority 30) and 2 (priority 20)
        assert set(sim.flow.cpu) == offloaded
        assert sim.result.drops_total == 2 - len(offloaded)


def test_trtllm_evicts_low_priority_first():
    rule = PriorityRule(default_priority=10, prefix_blocks=1, prefix_priority=90)
    sim = Simulator(SimConfig(gpu_blocks=3, semantics="trtllm", priorities=rule))
    sim.serve(request([1, 2, 3]))
    sim.serve(request([7]))                        # a new head block at priority 90
    # the lowest priority goes first, and within it the leaf: 2 still has its child 3
    assert 1 in sim.flow.gpu and 2 in sim.flow.gpu and 3 not in sim.flow.gpu


def test_engine_flows_evict_a_prompt_from_its_tail():
    """vLLM frees a finished request's blocks in reverse and TensorRT-LLM evicts only leaves,
    so a chain is evicted tail first and the next turn keeps the prefix that fits; the
    generic exclusive flow keeps plain LRU order (head first), like libCacheSim."""
    for semantics, kept in (("vllm", {1, 2}), ("trtllm", {1, 2}), ("exclusive", {2, 3})):
        sim = Simulator(SimConfig(gpu_blocks=3, semantics=semantics))
        sim.serve(request([1, 2, 3]))
        sim.serve(request([9]))                    # one slot needed
        assert set(sim.flow.gpu) == kept | {9}, semantics
        hits = sim.serve(request([1, 2, 3])).gpu_hit_tokens
        assert hits == (8 if semantics != "exclusive" else 0), semantics


def test_vllm_writes_through_to_cpu_and_stages_cold_hits_through_cpu():
    sim = Simulator(SimConfig(gpu_blocks=2, cpu_blocks=2, cold_blocks=None, semantics="vllm"))
    sim.serve(request([1, 2]))
    assert set(sim.flow.cpu) == {1, 2} and set(sim.flow.cold) == {1, 2}  # stored as they fill
    sim.serve(request([3, 4]))                     # GPU and CPU now hold 3, 4 only
    back = sim.serve(request([1, 2]))
    assert back.outcomes == (Outcome.COLD_PROMOTION,) * 2
    assert set(sim.flow.cpu) == {1, 2}            # staged through CPU on the way up
    sim.serve(request([5, 6]))
    again = sim.serve(request([3, 4]))
    assert again.outcomes == (Outcome.COLD_PROMOTION,) * 2


def test_vllm_store_threshold_stores_on_the_second_offer():
    sim = Simulator(SimConfig(gpu_blocks=1, cpu_blocks=8, semantics="vllm", store_threshold=2))
    sim.serve(request([1]))
    assert 1 not in sim.flow.cpu
    sim.serve(request([2]))                        # evicts 1 from the GPU
    sim.serve(request([1]))                        # recomputed, offered again: stored now
    assert 1 in sim.flow.cpu
    sim.serve(request([2]))
    assert sim.serve(request([1])).outcomes == (Outcome.CPU_PROMOTION,)


def test_vllm_offers_a_prompt_that_loaded_nothing_from_its_first_block():
    """vLLM's scheduler starts a request's stores at block 0 unless it loaded from a lower
    tier: a GPU hit is offered again, so store_threshold counts it (and stores it on its
    second offer though it was never recomputed)."""
    sim = Simulator(SimConfig(gpu_blocks=4, cpu_blocks=8, semantics="vllm", store_threshold=2))
    sim.serve(request([1, 2], prompt_tokens=9))   # 1 and 2 computed: first offer
    assert set(sim.flow.cpu) == set()
    again = sim.serve(request([1, 2, 3], prompt_tokens=13))
    assert again.outcomes[:2] == (Outcome.GPU_HIT,) * 2
    assert set(sim.flow.cpu) == {1, 2}            # their second offer, as GPU hits


def test_vllm_a_request_that_loads_offers_only_past_its_loads():
    sim = Simulator(SimConfig(gpu_blocks=1, cpu_blocks=8, semantics="vllm", store_threshold=2))
    for blocks in ([1, 2], [1, 2], [7, 8]):        # 1 and 2 stored on their second offer
        sim.serve(request(blocks, prompt_tokens=4 * len(blocks) + 1))
    assert {1, 2} <= set(sim.flow.cpu)
    sim.serve(request([1, 2, 3], prompt_tokens=13))   # loads 1 and 2: 3 is offered once
    sim.serve(request([9], prompt_tokens=5))
    sim.serve(request([1, 2, 3], prompt_tokens=13))   # loads again: 3's second offer
    assert 3 in sim.flow.cpu


def test_events_mirror_the_totals():
    events = []
    sim = Simulator(SimConfig(gpu_blocks=2, cpu_blocks=2), events=events.append)
    for record in random_prefix_trace(7, n_requests=40):
        sim.serve(record)
    kinds = [e.kind for e in events]
    assert kinds.count(Outcome.GPU_HIT) == sim.result.gpu_hit_blocks
    assert kinds.count(Outcome.CPU_PROMOTION) == sim.result.cpu_promotion_blocks
    assert kinds.count(Outcome.RECOMPUTE_MISS) == sim.result.recompute_blocks
    assert kinds.count(Outcome.STORE) == sim.result.cpu_stores_total
    assert kinds.count(Outcome.EVICT) == sim.result.gpu_evictions_total + sim.result.cpu_evictions_total


def test_record_gets_its_per_tier_tokens():
    sim = Simulator(SimConfig(gpu_blocks=4))
    sim.serve(request([1, 2]))
    record = request([1, 2, 3], prompt_tokens=10)
    filled = measured(record, sim.serve(record), "gpu-only")
    assert (filled.gpu_hit_tokens, filled.recomputed_tokens, filled.tier_config_id) == (8, 2, "gpu-only")


@pytest.mark.parametrize("kwargs, message", [
    ({"gpu_blocks": -1}, "gpu_blocks must be an int >= 0 or None"),
    ({"gpu_blocks": 1, "semantics": "sglang"}, "semantics must be one of exclusive, vllm, trtllm"),
    ({"gpu_blocks": 1, "semantics": "vllm", "policy": "s3fifo"}, "must be one of lru, arc, got 's3fifo'"),
    ({"gpu_blocks": 1, "semantics": "vllm", "store_threshold": 2, "cold_blocks": None}, "TieringOffloadingSpec"),
    ({"gpu_blocks": 1, "semantics": "trtllm", "cold_blocks": 5}, "cold_blocks must be 0 with semantics 'trtllm'"),
    ({"gpu_blocks": 1, "offload_comparison": ">="}, "offload_comparison must be one of ge, gt"),
])
def test_config_errors_name_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**kwargs)


def test_vllm_gpu_serves_all_but_the_last_token_and_never_caches_a_partial_block():
    sim = Simulator(SimConfig(gpu_blocks=8, semantics="vllm"))
    sim.serve(request([1, 2]))                        # 8 tokens: two full blocks
    again = sim.serve(request([1, 2]))                # fully cached: the last block recomputed
    assert again.outcomes == (Outcome.GPU_HIT, Outcome.RECOMPUTE_MISS)
    assert again.gpu_hit_tokens == 4 and again.recompute_tokens == 4
    sim.serve(request([5, 6], prompt_tokens=6))       # block 6 holds 2 tokens: not cached
    assert 5 in sim.flow.gpu and 6 not in sim.flow.gpu
    partial = sim.serve(request([5, 6, 7], prompt_tokens=10))
    assert partial.outcomes[:2] == (Outcome.GPU_HIT, Outcome.RECOMPUTE_MISS)


def test_vllm_gpu_recomputes_a_fully_cached_prompt_into_a_second_copy():
    sim = Simulator(SimConfig(gpu_blocks=2, semantics="vllm"))
    sim.serve(request([3]))
    sim.serve(request([4]))
    sim.serve(request([4]))            # [4] fully cached: a fresh block for it evicts 3
    assert 3 not in sim.flow.gpu and set(sim.flow.gpu) == {4}
    sim.serve(request([9]))            # evicts the older copy of 4; the newer still serves
    assert set(sim.flow.gpu) == {4, 9}
    assert sim.serve(request([4, 8])).outcomes[0] is Outcome.GPU_HIT
