"""Hit-ratio curves in one pass: LRU at every capacity from Mattson stack distances.

LRU is a stack algorithm: a reference hits in a cache of C blocks exactly when its stack
distance (1 + the number of distinct blocks used since its previous use) is at most C. With
prefix-contiguous accounting a block counts only if every earlier block of its request hit,
so block i of a request hits at capacity C iff the running maximum of the distances of blocks
0..i is at most C. One pass gives those maxima; a sort and a cumulative sum give the curve.
This equals a per-capacity replay of single-tier LRU in the simulator (blocks touched head to
tail), which a test checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from collector.events import RequestRecord

FIRST_USE = np.iinfo(np.int64).max  # distance of a first reference: a miss at every capacity


@dataclass(frozen=True)
class HitRatioCurve:
    """Cumulative hits by capacity. ``capacities_blocks[i]`` is the smallest capacity at which
    ``hit_tokens[i]`` prompt tokens (``hit_blocks[i]`` blocks) hit; between steps the value
    holds. ``prompt_tokens``/``block_refs`` are the denominators."""

    capacities_blocks: np.ndarray
    hit_tokens: np.ndarray
    hit_blocks: np.ndarray
    prompt_tokens: int
    block_refs: int

    def token_hit_ratio(self, capacity_blocks: int | None) -> float:
        """Token hit ratio of single-tier LRU with ``capacity_blocks`` (``None``: unlimited)."""
        return self._at(self.hit_tokens, capacity_blocks) / max(self.prompt_tokens, 1)

    def block_hit_ratio(self, capacity_blocks: int | None) -> float:
        return self._at(self.hit_blocks, capacity_blocks) / max(self.block_refs, 1)

    def _at(self, cumulative: np.ndarray, capacity_blocks: int | None) -> int:
        if capacity_blocks is None:
            return int(cumulative[-1]) if len(cumulative) else 0
        index = np.searchsorted(self.capacities_blocks, capacity_blocks, side="right")
        return int(cumulative[index - 1]) if index > 0 else 0

    def points(self, capacities_blocks: Iterable[int]) -> list[tuple[int, float]]:
        """``(capacity, token hit ratio)`` at each requested capacity."""
        return [(c, self.token_hit_ratio(c)) for c in capacities_blocks]


def stack_distances(hashes: np.ndarray) -> np.ndarray:
    """LRU stack distance of every reference (1-based); :data:`FIRST_USE` for first uses.

    A Fenwick tree over time marks each block's latest use; the distance of a reference is
    one plus the marks strictly between its previous use and now. O(n log n).
    """
    _, dense = np.unique(hashes, return_inverse=True)
    n = len(dense)
    tree = [0] * (n + 1)
    last: list[int] = [-1] * (int(dense.max()) + 1 if n else 0)  # -1: never used (local only)
    total_marks = 0
    out = np.empty(n, dtype=np.int64)
    for t, key in enumerate(dense.tolist()):
        p = last[key]
        if p < 0:
            out[t] = FIRST_USE
        else:
            out[t] = total_marks - _prefix_sum(tree, p + 1) + 1  # marks after p, plus itself
            _add(tree, p + 1, -1, n)
            total_marks -= 1
        _add(tree, t + 1, 1, n)
        total_marks += 1
        last[key] = t
    return out


def _prefix_sum(tree: list[int], i: int) -> int:
    total = 0
    while i > 0:
        total += tree[i]
        i -= i & -i
    return total


def _add(tree: list[int], i: int, delta: int, n: int) -> None:
    while i <= n:
        tree[i] += delta
        i += i & -i


def lru_curve(records: Iterable[RequestRecord], default_block_tokens: int = 16) -> HitRatioCurve:
    """The prefix-contiguous LRU hit-ratio curve of a trace, at every capacity, in one pass."""
    hashes, request_of, tokens, prompt_total = _flatten(records, default_block_tokens)
    distances = stack_distances(hashes)
    running_max = _running_max_per_request(distances, request_of)
    order = np.argsort(running_max, kind="stable")
    sorted_max = running_max[order]
    hit = sorted_max != FIRST_USE
    capacities, first = np.unique(sorted_max[hit], return_index=True)
    cum_tokens = np.cumsum(tokens[order][hit])
    cum_blocks = np.arange(1, len(cum_tokens) + 1)
    last = np.append(first[1:], len(cum_tokens)).astype(np.int64) - 1 if len(first) else first
    return HitRatioCurve(capacities, cum_tokens[last], cum_blocks[last], prompt_total,
                         len(hashes))


def _flatten(records: Iterable[RequestRecord], default_block_tokens: int):
    hashes: list[int] = []
    request_of: list[int] = []
    tokens: list[int] = []
    prompt_total = 0
    for index, record in enumerate(records):
        size = record.block_size_tokens or default_block_tokens
        prompt = record.prompt_tokens
        prompt_total += prompt
        for i, h in enumerate(record.block_hashes):
            hashes.append(h)
            request_of.append(index)
            tokens.append(max(0, min(size, prompt - i * size)))
    return (np.array(hashes, dtype=np.uint64), np.array(request_of, dtype=np.int64),
            np.array(tokens, dtype=np.int64), prompt_total)


def _running_max_per_request(distances: np.ndarray, request_of: np.ndarray) -> np.ndarray:
    """Running maximum that restarts at each request (requests are contiguous runs)."""
    if not len(distances):
        return distances
    starts = np.flatnonzero(np.r_[True, request_of[1:] != request_of[:-1]])
    out = np.empty_like(distances)
    bounds = np.append(starts, len(distances))
    # distances can be FIRST_USE (int64 max), so restart per run rather than offsetting.
    for begin, end in zip(bounds[:-1], bounds[1:]):
        np.maximum.accumulate(distances[begin:end], out=out[begin:end])
    return out
