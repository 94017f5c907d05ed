"""Narrated scenarios: what each policy evicts, step by step."""

import pytest

from kvtier.policy.sim.policies import (
    ARC,
    LRU,
    S3FIFO,
    Admitted,
    Belady,
    BlockInfo,
    OfferCountAdmitter,
    PriorityAdmitter,
    PriorityLRU,
    ScoreAdmitter,
)


def test_lru_store_1_to_4_then_5_evicts_1():
    cache = LRU(4)
    for key in (1, 2, 3, 4):
        assert cache.insert(key) == []
    assert cache.insert(5) == [1]


def test_lru_a_touch_saves_the_oldest():
    cache = LRU(4)
    for key in (1, 2, 3, 4):
        cache.insert(key)
    cache.touch(1)
    assert cache.insert(5) == [2]


def test_arc_ghost_hit_in_b1_grows_the_recency_target():
    cache = ARC(2)
    cache.insert(1), cache.insert(2)
    cache.touch(1)                  # 1 moves to T2 (seen twice)
    assert cache.insert(3) == [2]   # T1 = [2] is over target p = 0: 2 goes to ghost B1
    assert cache.p == 0
    assert cache.insert(2) == [1]   # ghost hit: p -> 1; T1 = [3] is not over p, so T2 gives 1
    assert cache.p == 1
    assert set(cache) == {2, 3}


def test_arc_keeps_a_reused_key_through_a_scan():
    cache = ARC(4)
    for key in ("hot", "hot2"):
        cache.insert(key)
        cache.touch(key)
    for key in range(20):           # a scan of one-time keys
        cache.insert(key)
    assert "hot" in cache and "hot2" in cache


def test_s3fifo_one_hit_wonders_leave_through_the_small_queue():
    cache = S3FIFO(10)              # small queue 1, main 9, ghost 9
    for key in range(1, 11):        # before any eviction, a full small queue spills into main
        cache.insert(key)
    cache.touch(1), cache.touch(1)
    assert cache.insert(11) == [2]  # 1, used twice while probationary, moves to main;
    assert 1 in cache               # main is then over its share and drops its oldest unused
    assert cache.insert(12) == [11]  # 11 was never used in the small queue: out, into the ghost
    assert cache.insert(11) == [12]  # the ghost remembers 11: straight to main; 12 leaves small
    assert 11 in cache
    assert cache.insert(13) == [3]   # main is over its share: its oldest unused key goes


def test_priority_lowest_priority_goes_first_then_lru():
    cache = PriorityLRU(3)
    cache.insert("a", BlockInfo(priority=50))
    cache.insert("b", BlockInfo(priority=10))
    cache.insert("c", BlockInfo(priority=50))
    assert cache.insert("d", BlockInfo(priority=35)) == ["b"]   # not "a", the oldest
    assert cache.insert("e", BlockInfo(priority=35)) == ["d"]
    assert cache.insert("f", BlockInfo(priority=90)) == ["e"]
    assert cache.insert("g", BlockInfo(priority=90)) == ["a"]   # LRU inside priority 50


def test_priority_reuse_requeues_at_the_new_priority():
    cache = PriorityLRU(2)
    cache.insert("a", BlockInfo(priority=80))
    cache.insert("b", BlockInfo(priority=50))
    cache.touch("a", BlockInfo(priority=0))
    assert cache.insert("c", BlockInfo(priority=50)) == ["a"]


def test_belady_evicts_the_farthest_next_use():
    cache = Belady(2)
    cache.insert("a", BlockInfo(next_use=5))
    cache.insert("b", BlockInfo(next_use=3))
    assert cache.insert("c", BlockInfo(next_use=4)) == ["a"]
    cache.touch("b", BlockInfo(next_use=float("inf")))
    assert cache.insert("d", BlockInfo(next_use=6)) == ["b"]


def test_store_threshold_admits_on_the_nth_offer():
    cache = Admitted(LRU(4), OfferCountAdmitter(min_offers=2))
    cache.insert("a")
    assert "a" not in cache
    cache.insert("a")
    assert "a" in cache


def test_store_threshold_tracker_forgets_the_oldest_offer():
    cache = Admitted(LRU(4), OfferCountAdmitter(min_offers=2, max_tracked=1))
    cache.insert("a"), cache.insert("b")   # tracking "b" pushes "a" out
    cache.insert("a")
    assert "a" not in cache


@pytest.mark.parametrize("comparison, admitted", [("ge", True), ("gt", False)])
def test_trtllm_offload_gate_at_the_threshold(comparison, admitted):
    gate = PriorityAdmitter(min_priority=30, comparison=comparison)
    assert gate.admit("k", BlockInfo(priority=30)) is admitted
    assert gate.admit("k", BlockInfo(priority=31)) is True
    assert gate.admit("k", BlockInfo(priority=29)) is False


def test_priority_gate_validates_its_values():
    with pytest.raises(ValueError, match="comparison must be one of ge, gt, got '>='"):
        PriorityAdmitter(comparison=">=")
    with pytest.raises(ValueError, match="min_priority must be in 0..100, got 101"):
        PriorityAdmitter(min_priority=101)


def test_score_admitter_refuses_below_threshold_without_evicting():
    cache = Admitted(LRU(1), ScoreAdmitter(lambda key, info: info.position, threshold=1))
    cache.insert("keep", BlockInfo(position=2))
    assert cache.insert("cheap", BlockInfo(position=0)) == []
    assert set(cache) == {"keep"}


def test_store_threshold_keeps_counting_a_stored_block():
    """vLLM's rule: a stored block stays counted, so offered again after it was evicted it is
    stored at once (while the tracker remembers it)."""
    cache = Admitted(LRU(1), OfferCountAdmitter(min_offers=2))
    cache.insert("a"), cache.insert("a")   # stored on its second offer
    cache.insert("b"), cache.insert("b")   # b's second offer evicts a
    assert "a" not in cache
    cache.insert("a")
    assert "a" in cache


def test_store_threshold_counts_a_batch_as_one_offer_and_keeps_it_tracked():
    gate = OfferCountAdmitter(min_offers=2, max_tracked=2)
    gate.offer(["a", "b"])
    gate.offer(["a", "b", "c"])   # the tracker is full: c is not counted, a and b stay
    assert gate.passes("a") and gate.passes("b") and not gate.passes("c")
