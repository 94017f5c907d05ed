"""The reuse pass as a plain per-reference loop: the oracle :func:`kvtier.policy.reuse.collect.collect`
is checked against.

Per distinct block: references, depth (position in the prompt), parent, tokens, and when it
was first and last used. Per reuse: the time since the block was created (first use) and since
its previous use, in log histograms by request type. Per request: the ideal reusable prefix
(leading blocks seen before: an unlimited cache's prefix hit).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvtier.collector.events import RequestRecord
from kvtier.policy.reuse.histogram import LogHistogram
from kvtier.policy.reuse.stats import ALL, BlockStats, ReuseStats, turn_bucket

def reference_collect(records: Iterable[RequestRecord], default_block_tokens: int = 16) -> ReuseStats:
    """Gather :class:`ReuseStats` from arrival-ordered records."""
    stats = ReuseStats()
    for record in records:
        _observe(stats, record, default_block_tokens)
    return stats


def _observe(stats: ReuseStats, record: RequestRecord, default_block_tokens: int) -> None:
    now = record.arrival_s
    size = record.block_size_tokens or default_block_tokens
    stats.block_tokens = stats.block_tokens or size
    kind = record.request_type or ALL
    turn = turn_bucket(record.turn)
    stats.requests += 1
    stats.prompt_tokens += record.prompt_tokens
    stats.block_refs += len(record.block_hashes)
    stats.first_s = now if stats.first_s is None else stats.first_s
    stats.last_s = now
    stats.has_measured_gpu_hits |= record.gpu_hit_tokens is not None
    prefix_open, hit_tokens, parent = True, 0, None
    for depth, h in enumerate(record.block_hashes):
        tokens = max(0, min(size, record.prompt_tokens - depth * size))
        block = stats.blocks.get(h)
        if block is None:
            prefix_open = False
            stats.blocks[h] = BlockStats(1, depth, parent, tokens, now, now, kind)
        else:
            if prefix_open:
                hit_tokens += tokens
            _histogram(stats.since_creation, kind).add(now - block.first_s)
            _histogram(stats.since_last_use, kind).add(now - block.last_s)
            if turn is not None:
                _histogram(stats.since_last_use_by_turn, turn).add(now - block.last_s)
            block.refs += 1
            block.last_s = now
        parent = h
    stats.ideal_hit_tokens += hit_tokens
    stats.ideal_hit_tokens_per_request.append(hit_tokens)


def _histogram(by_type: dict[str, LogHistogram], kind: str) -> LogHistogram:
    histogram = by_type.get(kind)
    if histogram is None:
        histogram = by_type[kind] = LogHistogram()
    return histogram


