"""One pass over a trace that gathers everything the reuse report needs.

Per distinct block: references, depth (position in the prompt), parent, tokens, and when it
was first and last used. Per reuse: the time since the block was created (first use) and since
its previous use, in log histograms by request type. Per request: the ideal reusable prefix
(leading blocks seen before: an unlimited cache's prefix hit).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from collector.events import RequestRecord
from policy.reuse.histogram import LogHistogram

ALL = "all"


@dataclass(slots=True)
class BlockStats:
    refs: int
    depth: int
    parent: int | None
    tokens: int
    first_s: float
    last_s: float
    request_type: str


@dataclass
class ReuseStats:
    """Totals of one pass (see the module docstring). Build with :func:`collect`."""

    blocks: dict[int, BlockStats] = field(default_factory=dict)
    requests: int = 0
    prompt_tokens: int = 0
    block_refs: int = 0
    ideal_hit_tokens: int = 0
    first_s: float | None = None
    last_s: float | None = None
    since_creation: dict[str, LogHistogram] = field(default_factory=dict)
    since_last_use: dict[str, LogHistogram] = field(default_factory=dict)
    since_last_use_by_turn: dict[str, LogHistogram] = field(default_factory=dict)
    ideal_hit_tokens_per_request: list[int] = field(default_factory=list)
    has_measured_gpu_hits: bool = False
    block_tokens: int | None = None

    @property
    def duration_s(self) -> float:
        if self.first_s is None:
            return 0.0
        return self.last_s - self.first_s

    @property
    def ideal_token_hit_ratio(self) -> float:
        return self.ideal_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def collect(records: Iterable[RequestRecord], default_block_tokens: int = 16) -> ReuseStats:
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
    turn = _turn_bucket(record.turn)
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


TURN_BUCKETS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, None))


def _turn_bucket(turn: int | None) -> str | None:
    """``"1"``, ``"2"``, ``"3-5"``, ``"6-10"``, ``"11+"``; ``None`` when the trace has no turns."""
    if turn is None:
        return None
    for low, high in TURN_BUCKETS:
        if turn >= low and (high is None or turn <= high):
            return f"{low}+" if high is None else (str(low) if low == high else f"{low}-{high}")
    return "0"
