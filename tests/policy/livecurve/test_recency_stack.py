"""The compiled recency stack against a plain list: stack distances block by block, through
its trimming (marks past its limit dropped) and its compactions (the time line renumbered)."""

from __future__ import annotations

import random

import pytest

from kvtier.policy.livecurve._recency import RecencyStack


def brute_distance(order: list[int], block: int, limit: int) -> int | None:
    """1 + the distinct blocks used since ``block`` (most recent last); ``None`` beyond
    ``limit`` or never used."""
    if block not in order:
        return None
    distance = len(order) - order.index(block)
    return distance if distance <= limit else None


@pytest.mark.parametrize("limit,keys,steps", [(50, 120, 20_000), (7, 9, 3_000), (300, 2_000, 20_000)])
def test_distances_equal_a_plain_lru_list_through_trims_and_compactions(limit, keys, steps):
    rng = random.Random(limit)
    stack, order = RecencyStack(limit), []
    for step in range(steps):
        # a skewed key choice keeps some blocks hot and lets others age past the limit
        block = int(rng.paretovariate(1.2) * 7) % keys if step % 3 else rng.randrange(keys)
        assert stack.distance_of(block) == brute_distance(order, block, limit), step
        if block in order:
            order.remove(block)
        order.append(block)
        stack.use(block)
        assert stack.live == min(len(order), limit)
        assert stack.held_ids == stack.live  # a block's id lives while its mark does


def test_the_narrated_stack():
    """use 1, 2, 3: 3 is at distance 1, 1 at 3; use 1 again: 1 at 1, 2 at 3; with a limit
    of 3, using 4 drops 2 (the least recent), which then misses at every size."""
    stack = RecencyStack(3)
    for block in (1, 2, 3):
        stack.use(block)
    assert [stack.distance_of(b) for b in (3, 2, 1)] == [1, 2, 3]
    stack.use(1)
    assert [stack.distance_of(b) for b in (1, 3, 2)] == [1, 2, 3]
    stack.use(4)
    assert stack.distance_of(2) is None and stack.distance_of(4) == 1 and stack.live == 3
    assert stack.distance_of(0) is None  # a hash of 0 is a block like any other
    stack.use(0)
    assert stack.distance_of(0) == 1 and stack.distance_of(3) is None


def test_the_kernel_holds_ids_only_for_what_its_tiers_and_stacks_hold():
    """Long traffic through small tiers: the ids alive stay within what the stacks and the
    simulated tiers can hold (an id nobody holds is forgotten)."""
    import numpy as np

    from kvtier.policy.livecurve._recency import VLLM, LiveKernel

    rng = np.random.default_rng(3)
    kernel = LiveKernel(VLLM, 40, 200, np.array([50, 100, 200], dtype=np.int64),
                        np.array([30, 60, 60], dtype=np.int64), np.array([0, 0, 90], dtype=np.int64))
    for _ in range(50):
        lengths = rng.integers(1, 30, size=40)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        hashes = rng.integers(0, 50_000, size=offsets[-1]).astype(np.uint64)  # churn, some reuse
        kernel.serve(hashes, offsets, lengths * 16, np.full(40, 16, dtype=np.int64),
                     np.zeros(kernel.bins, dtype=np.int64), np.zeros(3, dtype=np.int64),
                     np.zeros(4, dtype=np.int64))
        assert kernel.held_blocks <= 200 + (2 * 40 + 4096) + 30 + 60 + 60 + 90


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="limit must be >= 1"):
        RecencyStack(0)
