"""The GPU tier's capacity as the engine reported it, from the metrics a collector scraped
(``kvtier collect --scrape URL``) into a store or its segments.

vLLM publishes its KV-cache geometry as the ``vllm:cache_config_info`` gauge, whose labels
hold ``num_gpu_blocks`` and ``block_size`` (tokens). One of those blocks is vLLM's null
block, which never holds KV, so the prefix cache holds ``num_gpu_blocks - 1`` blocks
(as ``kvtier calibrate`` counts it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

METRIC = "vllm:cache_config_info"
NULL_BLOCKS = 1
_SQL = (f"SELECT labels FROM {{events}} WHERE metric = '{METRIC}' "
        "ORDER BY end_s DESC LIMIT 1")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class RecordedGpu:
    """The GPU prefix cache: ``blocks`` of ``block_tokens`` tokens; ``where`` it was read."""

    blocks: int
    block_tokens: int
    where: str

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_tokens

    @property
    def note(self) -> str:
        return (f"{METRIC} in {self.where}: {self.blocks + NULL_BLOCKS} blocks of "
                f"{self.block_tokens} tokens, less vLLM's null block")


def recorded_gpu(reader) -> RecordedGpu | None:
    """The latest GPU capacity the engine behind ``reader`` (a store's or a segment
    folder's reader) published; ``None`` when nothing scraped it (or for a trace)."""
    from kvtier.collector.ddl import METRIC_INTERVALS_TABLE
    from kvtier.collector.event_rows import table_rows

    found = table_rows(reader, _SQL, METRIC_INTERVALS_TABLE)
    if not found or not found[0]:
        return None
    (row,), where = found
    return published_gpu(row["labels"], where)


def published_gpu(labels: str | None, where: str) -> RecordedGpu | None:
    """The GPU prefix cache the labels of one ``vllm:cache_config_info`` sample describe
    (as Prometheus writes them, ``block_size="16",num_gpu_blocks="2048",...``); ``None``
    when they do not."""
    named = dict(_LABEL.findall(labels or ""))
    try:
        blocks, block_tokens = int(named["num_gpu_blocks"]), int(named["block_size"])
    except (KeyError, ValueError):
        return None
    if blocks <= NULL_BLOCKS or block_tokens < 1:
        return None
    return RecordedGpu(blocks - NULL_BLOCKS, block_tokens, where)
