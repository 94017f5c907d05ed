"""Mooncake FAST'25 traces (Kimi): one JSON object per line.

``{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}``.
``hash_ids`` are prefix-chained block ids over 512-token blocks, global within a file, and
``len(hash_ids) == ceil(input_length / 512)`` (the last block may be partial). Chained, each
id names a whole prefix, so one request never holds an id twice: a line that does is refused
(a replay would count the block as its own hit).
Timestamps are coarse (3 s steps), so ties keep file order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from kvtier.collector.events import RequestRecord
from kvtier.policy.readers.base import (
    BadLine,
    JsonLinesReader,
    check_fields,
    hash_list,
    non_negative_int,
    non_negative_number,
)

FIELDS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
DEFAULT_BLOCK_TOKENS = 512


class MooncakeReader(JsonLinesReader):
    """Reads a Mooncake JSONL trace (plain or ``.gz``) as request records.

    ``request_id`` is ``"<file stem>:<line>"``; ``arrival_s`` is ``timestamp / 1000``.
    Iterating again re-reads the file; ``skipped`` counts the bad lines of the last pass.
    """

    format_name = "mooncake"

    def __init__(self, path: str | Path, *, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                 skip_bad: bool = False) -> None:
        super().__init__(path, block_tokens=block_tokens, skip_bad=skip_bad)

    def requests(self) -> Iterator[RequestRecord]:
        records = self._parsed(self._record)
        records.sort(key=lambda r: r.arrival_s)  # stable: ties keep file order
        return iter(records)

    def _record(self, line: int, obj: dict) -> RequestRecord:
        check_fields(obj, FIELDS)
        prompt = non_negative_int(obj, "input_length")
        expected = math.ceil(prompt / self.block_tokens)
        hashes = hash_list(obj, "hash_ids", expected, f"ceil(input_length/{self.block_tokens})")
        _distinct(hashes)
        return RequestRecord(
            request_id=f"{self.path.name.split('.')[0]}:{line}",
            arrival_s=non_negative_number(obj, "timestamp") / 1000.0,
            prompt_tokens=prompt,
            output_tokens=non_negative_int(obj, "output_length"),
            block_hashes=hashes,
            block_size_tokens=self.block_tokens,
        )


def _distinct(hashes: tuple[int, ...]) -> None:
    """``BadLine`` naming the first id a request repeats, and where."""
    if len(set(hashes)) == len(hashes):
        return
    first: dict[int, int] = {}
    for position, block in enumerate(hashes):
        if block in first:
            raise BadLine(f"hash_ids repeats id {block} (at positions {first[block]} and "
                          f"{position}); ids are prefix-chained, so each block of a request "
                          "has its own")
        first[block] = position
