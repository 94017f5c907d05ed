"""The reuse pass: everything the reuse report needs, from arrays in a few numpy passes.

Per distinct block: references, depth (position in the prompt), parent, tokens, and when it
was first and last used. Per reuse: the time since the block was created (first use) and since
its previous use, in log histograms by request type. Per request: the ideal reusable prefix
(leading blocks seen before: an unlimited cache's prefix hit).


One stable sort of the block ids groups every block's references (first use, last use, count,
previous use of each reference); reuse intervals, creation ages and each request's reusable
prefix follow without a per-reference Python loop. Only the per-block table is built in
Python, once per distinct block. A test checks it against a plain per-reference loop.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.runs import RunTrace, RunTraceBuilder
from kvtier.policy.reuse.stats import ALL, BlockStats, ReuseStats, turn_bucket
from kvtier.policy.reuse.histogram import LogHistogram


class _Requests:
    """Per-request columns gathered while the records stream past."""

    def __init__(self) -> None:
        self.arrival_s: list[float] = []
        self.kind: list[str] = []
        self.turn: list[str | None] = []
        self.prompt: list[int] = []
        self.measured = False

    def add(self, record: RequestRecord) -> None:
        self.arrival_s.append(record.arrival_s)
        self.kind.append(record.request_type or ALL)
        self.turn.append(turn_bucket(record.turn))
        self.prompt.append(record.prompt_tokens)
        self.measured |= record.gpu_hit_tokens is not None


def collect(records: Iterable[RequestRecord], default_block_tokens: int = 16) -> ReuseStats:
    """The :class:`ReuseStats` of arrival-ordered records."""
    return collect_with_trace(records, default_block_tokens)[0]


def collect_with_trace(records: Iterable[RequestRecord], default_block_tokens: int = 16
                       ) -> tuple[ReuseStats, RunTrace]:
    """:func:`collect` and the flattened trace (for :func:`kvtier.policy.curves.lru_curve_of`)."""
    builder, columns = RunTraceBuilder(default_block_tokens), _Requests()
    for record in records:
        builder.add(record)
        columns.add(record)
    trace = builder.build()
    stats = ReuseStats(requests=len(columns.prompt), prompt_tokens=sum(columns.prompt),
                       block_refs=len(trace.hashes), has_measured_gpu_hits=columns.measured)
    if not stats.requests:
        return stats, trace
    stats.first_s, stats.last_s = columns.arrival_s[0], columns.arrival_s[-1]
    stats.block_tokens = int(trace.block_tokens[0])
    _fill(stats, trace, columns)
    return stats, trace


def _fill(stats: ReuseStats, trace, columns: _Requests) -> None:
    # int32 positions and codes, and intermediates freed early: WEKA has 82 M references
    n = len(trace.hashes)
    index = np.int32 if n < 2**31 else np.int64
    lengths = np.diff(np.append(trace.request_start, n))
    request_of = np.repeat(np.arange(len(lengths), dtype=index), lengths)
    order = np.argsort(trace.hashes, kind="stable").astype(index)
    sorted_hashes = trace.hashes[order]
    boundary = np.ones(n, dtype=bool)
    boundary[1:] = sorted_hashes[1:] != sorted_hashes[:-1]
    del sorted_hashes
    starts = np.flatnonzero(boundary)
    sizes = np.diff(np.append(starts, n))
    first = order[starts]                        # first reference of each block
    last = order[starts + sizes - 1]
    prev = np.full(n, -1, dtype=index)
    repeat = ~boundary[1:]
    prev[order[1:][repeat]] = order[:-1][repeat]
    created_at = np.empty(n, dtype=index)
    created_at[order] = np.repeat(first, sizes)
    del order, boundary, repeat
    arrival = np.asarray(columns.arrival_s, dtype=float)
    _reuse_histograms(stats, columns, arrival, request_of, prev, created_at)
    del created_at
    _ideal_prefixes(stats, trace, lengths, prev, columns.prompt)
    del prev
    _block_table(stats, trace, columns, arrival, request_of, first, last, sizes)


def _codes(labels: list) -> tuple[np.ndarray, list]:
    """Small-int codes for per-request labels, and the labels in code order."""
    names = list(dict.fromkeys(labels))
    code = {name: i for i, name in enumerate(names)}
    return np.array([code[label] for label in labels], dtype=np.int16), names


def _reuse_histograms(stats, columns, arrival, request_of, prev, created_at) -> None:
    reuse = np.flatnonzero(prev >= 0)
    by_request = request_of[reuse]
    now = arrival[by_request]
    since_last = now - arrival[request_of[prev[reuse]]]
    since_creation = now - arrival[request_of[created_at[reuse]]]
    del now
    kind_codes, kinds = _codes(columns.kind)
    reuse_kind = kind_codes[by_request]
    for code, kind in enumerate(kinds):
        mask = reuse_kind == code
        if mask.any():
            stats.since_creation.setdefault(kind, LogHistogram()).add_many(since_creation[mask])
            stats.since_last_use.setdefault(kind, LogHistogram()).add_many(since_last[mask])
    turn_codes, turns = _codes(columns.turn)
    reuse_turn = turn_codes[by_request]
    for code, bucket in enumerate(turns):
        mask = reuse_turn == code
        if bucket is not None and mask.any():
            stats.since_last_use_by_turn.setdefault(bucket, LogHistogram()).add_many(since_last[mask])


def _ideal_prefixes(stats, trace, lengths, prev, prompts) -> None:
    """Per request, the leading blocks seen before (an unlimited cache's prefix hit)."""
    n = len(prev)
    positions = np.where(prev < 0, np.arange(n, dtype=prev.dtype), n)
    starts = trace.request_start
    nonempty = lengths > 0
    first_new = np.full(len(lengths), n, dtype=np.int64)
    if nonempty.any():
        first_new[nonempty] = np.minimum.reduceat(positions, starts[nonempty])
    k = np.minimum(first_new - starts, lengths)
    hit = np.minimum(k * trace.block_tokens, np.asarray(prompts, dtype=np.int64))
    stats.ideal_hit_tokens_per_request = hit.tolist()
    stats.ideal_hit_tokens = int(hit.sum())


def _block_table(stats, trace, columns, arrival, request_of, first, last, refs) -> None:
    by_creation = np.argsort(first, kind="stable")  # the table lists blocks as they appear
    first, last, refs = first[by_creation], last[by_creation], refs[by_creation]
    requests = request_of[first]
    depth = first - trace.request_start[requests]
    size = trace.block_tokens[requests]
    prompt = np.asarray(columns.prompt, dtype=np.int64)[requests]
    tokens = np.clip(prompt - depth * size, 0, size)
    parent = np.where(depth > 0, trace.hashes[np.maximum(first - 1, 0)], 0)
    kinds = columns.kind
    hashes = trace.hashes[first].tolist()
    rows = zip(hashes, refs.tolist(), depth.tolist(), parent.tolist(), tokens.tolist(),
               arrival[requests].tolist(), arrival[request_of[last]].tolist(), requests.tolist())
    stats.blocks = {h: BlockStats(r, d, p if d > 0 else None, t, f, lt, kinds[q])
                    for h, r, d, p, t, f, lt, q in rows}
