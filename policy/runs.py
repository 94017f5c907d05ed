"""Runs of references with equal LRU stack distance, and their distances (see curves.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord


@dataclass(frozen=True)
class RunTrace:
    """A trace flattened to arrays: every block reference's id, and per request its first
    reference, block size and the tokens of its last block (partial blocks count less)."""

    hashes: np.ndarray          # uint64, one per block reference
    request_start: np.ndarray   # int64, index of each request's first reference
    block_tokens: np.ndarray    # int64, per request
    last_block_tokens: np.ndarray  # int64, per request (0 for a request without blocks)
    prompt_tokens: int

    @classmethod
    def from_records(cls, records: Iterable[RequestRecord], default_block_tokens: int) -> RunTrace:
        builder = RunTraceBuilder(default_block_tokens)
        for record in records:
            builder.add(record)
        return builder.build()


class RunTraceBuilder:
    """Accumulates records into a :class:`RunTrace` (so another pass can share the read)."""

    def __init__(self, default_block_tokens: int) -> None:
        self.default_block_tokens = default_block_tokens
        self._chunks: list[np.ndarray] = []
        self._starts: list[int] = []
        self._sizes: list[int] = []
        self._lasts: list[int] = []
        self._offset = 0
        self._prompt_total = 0

    def add(self, record: RequestRecord) -> None:
        size = record.block_size_tokens or self.default_block_tokens
        n = len(record.block_hashes)
        self._chunks.append(np.array(record.block_hashes, dtype=np.uint64))
        self._starts.append(self._offset)
        self._sizes.append(size)
        self._lasts.append(max(0, min(size, record.prompt_tokens - (n - 1) * size)) if n else 0)
        self._offset += n
        self._prompt_total += record.prompt_tokens

    def build(self) -> RunTrace:
        chunks = self._chunks
        hashes = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint64)
        return RunTrace(hashes, np.array(self._starts, dtype=np.int64),
                        np.array(self._sizes, dtype=np.int64),
                        np.array(self._lasts, dtype=np.int64), self._prompt_total)


@dataclass(frozen=True)
class Runs:
    """Maximal stretches of references whose previous uses are consecutive positions (or
    that are all first uses), never spanning two requests."""

    starts: np.ndarray   # int64 position of each run's first reference
    lengths: np.ndarray  # int64
    prev: np.ndarray     # int64 previous use of each run's first reference, or -1
    request: np.ndarray  # int64 request index of each run

    def tokens(self, trace: RunTrace) -> np.ndarray:
        """Prompt tokens each run covers (a request's partial last block counts its tokens)."""
        size = trace.block_tokens[self.request]
        tokens = self.lengths * size
        ends = self.starts + self.lengths
        request_end = np.append(trace.request_start[1:], len(trace.hashes))[self.request]
        holds_last = ends == request_end
        tokens[holds_last] -= size[holds_last] - trace.last_block_tokens[self.request][holds_last]
        return tokens


def previous_use(hashes: np.ndarray) -> np.ndarray:
    """For each reference the position of the same block's previous reference, or -1."""
    n = len(hashes)
    order = np.argsort(hashes, kind="stable").astype(np.int32 if n < 2**31 else np.int64)
    sorted_hashes = hashes[order]
    same = sorted_hashes[1:] == sorted_hashes[:-1]
    del sorted_hashes
    prev = np.full(n, -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    return prev


def find_runs(trace: RunTrace) -> Runs:
    prev = previous_use(trace.hashes)
    n = len(prev)
    continues = np.zeros(n, dtype=bool)
    if n > 1:
        both_first = (prev[1:] < 0) & (prev[:-1] < 0)
        consecutive = (prev[:-1] >= 0) & (prev[1:] == prev[:-1] + 1)
        continues[1:] = both_first | consecutive
    starts_in_range = trace.request_start[trace.request_start < n]
    continues[starts_in_range] = False
    starts = np.flatnonzero(~continues).astype(np.int64)
    lengths = np.diff(np.append(starts, n)).astype(np.int64)
    request = np.searchsorted(trace.request_start, starts, side="right").astype(np.int64) - 1
    return Runs(starts, lengths, prev[starts], request)


def run_distances(runs: Runs, n_refs: int, first_use: int) -> np.ndarray:
    """The stack distance of each run: 1 + the blocks whose latest use lies after the run's
    previous use. Latest-use marks move a run at a time: off ``[prev, prev+L)``, onto
    ``[start, start+L)`` (both ranges hold exactly those marks, so range adds are exact)."""
    bounds = np.unique(np.concatenate([runs.starts, runs.starts + runs.lengths,
                                       runs.prev[runs.prev >= 0],
                                       (runs.prev + runs.lengths)[runs.prev >= 0], [0, n_refs]]))
    marks = _SegmentCounter(bounds)
    out = np.empty(len(runs.starts), dtype=np.int64)
    total = 0
    for i, (start, length, prev) in enumerate(zip(runs.starts.tolist(), runs.lengths.tolist(),
                                                  runs.prev.tolist())):
        if prev < 0:
            out[i] = first_use
        else:
            out[i] = total - marks.prefix(prev)  # marks from prev on: itself and newer ones
            marks.add(prev, prev + length, -1)
            total -= length
        marks.add(start, start + length, 1)
        total += length
    return out


class _SegmentCounter:
    """Range add / prefix sum over positions, on the elementary segments between ``bounds``
    (every range endpoint is a bound, so each segment holds one value). Two Fenwick trees."""

    def __init__(self, bounds: np.ndarray) -> None:
        self.bounds = bounds
        self.index = {b: i for i, b in enumerate(bounds.tolist())}
        self.size = len(bounds)
        self.b1 = [0] * (self.size + 1)
        self.b2 = [0] * (self.size + 1)

    def add(self, lo: int, hi: int, delta: int) -> None:
        """Add ``delta`` to every position in ``[lo, hi)``."""
        self._point(self.index[lo], delta)
        self._point(self.index[hi], -delta)

    def _point(self, segment: int, delta: int) -> None:
        weighted = delta * int(self.bounds[segment])
        i = segment + 1
        b1, b2, size = self.b1, self.b2, self.size
        while i <= size:
            b1[i] += delta
            b2[i] += weighted
            i += i & -i

    def prefix(self, position: int) -> int:
        """Sum over positions ``[0, position)``; ``position`` must be a bound."""
        segment = self.index[position]  # segments [0, segment) are whole
        s1 = s2 = 0
        i = segment
        b1, b2 = self.b1, self.b2
        while i > 0:
            s1 += b1[i]
            s2 += b2[i]
            i -= i & -i
        return s1 * position - s2
