"""vLLM's CPU tier, narrated: tails go before heads, stores are all-or-nothing, ARC learns."""

from tests.policy.sim.oracle.vllm_cpu import VllmCpuTier


def serve(tier, hashes):
    """One request in a CPU-only deployment; returns its prefix hits."""
    tier.begin()
    hits = 0
    for h in hashes:
        if h not in tier:
            break
        hits += 1
    pairs = list(zip(hashes, range(len(hashes))))
    if hits:
        tier.load(pairs[:hits])
    outcome = tier.store(pairs[hits:])
    tier.finish()
    return hits, outcome


def test_lru_evicts_a_requests_tail_before_its_head():
    tier = VllmCpuTier(4, "lru")
    serve(tier, [1, 2, 3, 4])
    hits, (stored, evicted) = serve(tier, [9])
    assert hits == 0 and stored == [9] and evicted == [4]  # the tail, not the head


def test_lru_a_reused_head_outlives_newer_tails():
    tier = VllmCpuTier(4, "lru")
    serve(tier, [1, 2])
    serve(tier, [5, 6])
    assert serve(tier, [1])[0] == 1      # 1 is reused: newest now
    _, (_, evicted) = serve(tier, [7, 8])
    assert evicted == [2, 6]


def test_store_is_all_or_nothing():
    tier = VllmCpuTier(2, "lru")
    serve(tier, [1])
    hits, outcome = serve(tier, [5, 6, 7])  # three new blocks cannot fit in two slots
    assert hits == 0 and outcome is None
    assert set(tier) == {1}                 # nothing stored, nothing evicted


def test_hits_are_not_protected_from_the_requests_own_store():
    tier = VllmCpuTier(2, "lru")
    serve(tier, [1, 2])
    hits, (stored, evicted) = serve(tier, [1, 2, 3])
    assert hits == 2 and stored == [3] and evicted == [2]  # as in vLLM: only the offer is


def test_store_threshold_needs_two_offers():
    tier = VllmCpuTier(4, "lru", store_threshold=2)
    assert serve(tier, [1])[1] == ([], [])
    assert serve(tier, [1])[1] == ([1], [])
    assert serve(tier, [1])[0] == 1


def test_arc_reuse_moves_a_block_to_t2_and_scans_evict_from_t1():
    tier = VllmCpuTier(3, "arc")
    serve(tier, [1])
    serve(tier, [1])                      # reused: T1 -> T2
    for h in (10, 11, 12, 13):
        serve(tier, [h])
    assert 1 in tier and tier.core.t2.keys() == {1}


def test_arc_ghost_hit_grows_the_t1_target():
    tier = VllmCpuTier(2, "arc")
    serve(tier, [1]), serve(tier, [2]), serve(tier, [3])   # 1 evicted into ghost list B1
    assert 1 in tier.core.b1 and tier.core.target_t1 == 0
    serve(tier, [1])
    assert tier.core.target_t1 == 1
