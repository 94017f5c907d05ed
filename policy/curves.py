"""Hit-ratio curves in one pass: LRU at every capacity from Mattson stack distances.

LRU is a stack algorithm: a reference hits in a cache of C blocks exactly when its stack
distance (1 + the number of distinct blocks used since its previous use) is at most C. With
prefix-contiguous accounting a block counts only if every earlier block of its request hit,
so block i of a request hits at capacity C iff the running maximum of the distances of blocks
0..i is at most C. This equals a per-capacity replay of single-tier LRU in the simulator
(blocks touched head to tail), which a test checks.

**Runs.** If a reference's previous use is one position after the previous reference's
previous use (a prompt re-sending a stretch of an earlier prompt in order), both references
have the same distance: their look-back windows differ by one block leaving and one arriving.
Prompts in LLM traffic are such stretches (agentic traces re-send their whole history), so
distances are computed per run, not per reference: 82 M WEKA references form ~84 k runs.
Per run the window count comes from a Fenwick tree with range updates over the run-boundary
coordinates; finding runs takes one stable sort of the block ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.runs import RunTrace, find_runs, run_distances

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
        if not len(cumulative):
            return 0
        if capacity_blocks is None:
            return int(cumulative[-1])
        index = np.searchsorted(self.capacities_blocks, capacity_blocks, side="right")
        return int(cumulative[index - 1]) if index > 0 else 0

    def points(self, capacities_blocks: Iterable[int | None]) -> list[tuple[int | None, float]]:
        """``(capacity, token hit ratio)`` at each requested capacity."""
        return [(c, self.token_hit_ratio(c)) for c in capacities_blocks]


def lru_curve(records: Iterable[RequestRecord], default_block_tokens: int = 16) -> HitRatioCurve:
    """The prefix-contiguous LRU hit-ratio curve of a trace, at every capacity, in one pass."""
    return lru_curve_of(RunTrace.from_records(records, default_block_tokens))


def lru_curve_of(trace: RunTrace) -> HitRatioCurve:
    """:func:`lru_curve` of an already flattened trace."""
    runs = find_runs(trace)
    distances = run_distances(runs, len(trace.hashes), FIRST_USE)
    running_max = _running_max_per_request(distances, runs.request)
    tokens = runs.tokens(trace)
    order = np.argsort(running_max, kind="stable")
    sorted_max = running_max[order]
    hit = sorted_max != FIRST_USE
    capacities, first = np.unique(sorted_max[hit], return_index=True)
    cum_tokens = np.cumsum(tokens[order][hit])
    cum_blocks = np.cumsum(runs.lengths[order][hit])
    last = np.append(first[1:], len(cum_tokens)).astype(np.int64) - 1 if len(first) else first
    return HitRatioCurve(capacities, cum_tokens[last], cum_blocks[last], trace.prompt_tokens,
                         len(trace.hashes))


def _running_max_per_request(distances: np.ndarray, request: np.ndarray) -> np.ndarray:
    """Running maximum over runs that restarts at each request (runs never span two)."""
    out = np.empty_like(distances)
    current, owner = 0, -1
    for i, (d, r) in enumerate(zip(distances.tolist(), request.tolist())):
        current = d if r != owner or d > current else current
        owner = r
        out[i] = current
    return out
