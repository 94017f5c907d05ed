"""Alibaba Bailian / Qwen traces ("KVCache Cache in the Wild", ATC'25): JSONL, often gzipped.

``{"chat_id", "parent_chat_id" (-1 for a root), "timestamp" (s), "input_length",
"output_length", "type", "turn", "hash_ids"}`` with 16-token blocks and
``len(hash_ids) == ceil(input_length / 16)``.

Sessions: a request's ``session_id`` is the ``chat_id`` of the root of its parent chain
(parents precede children in arrival order; an unknown parent starts its own session, named
after that parent). ``parent_request_id`` is the parent's ``chat_id`` or ``None`` for a root.
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

FIELDS = frozenset({"chat_id", "parent_chat_id", "timestamp", "input_length", "output_length",
                    "type", "turn", "hash_ids"})
DEFAULT_BLOCK_TOKENS = 16
ROOT_PARENT = -1  # the format's own marker for "no parent"; never leaves this module


class BailianReader(JsonLinesReader):
    """Reads a Bailian JSONL trace (plain or ``.gz``) as request records sorted by arrival."""

    format_name = "bailian"

    def __init__(self, path: str | Path, *, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                 skip_bad: bool = False) -> None:
        super().__init__(path, block_tokens=block_tokens, skip_bad=skip_bad)

    def requests(self) -> Iterator[RequestRecord]:
        rows = self._parsed(lambda line, obj: self._row(obj))
        rows.sort(key=lambda row: row["arrival_s"])
        return self._with_sessions(rows)

    def _row(self, obj: dict) -> dict:
        check_fields(obj, FIELDS)
        prompt = non_negative_int(obj, "input_length")
        chat_id, parent = obj["chat_id"], obj["parent_chat_id"]
        for name, value in (("chat_id", chat_id), ("parent_chat_id", parent)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadLine(f"{name} must be an integer, got {value!r}")
        if parent < 0 and parent != ROOT_PARENT:
            raise BadLine(f"parent_chat_id must be -1 or a chat id, got {parent}")
        if not isinstance(obj["type"], str):
            raise BadLine(f"type must be a string, got {obj['type']!r}")
        expected = math.ceil(prompt / self.block_tokens)
        return {
            "chat_id": chat_id, "parent": None if parent == ROOT_PARENT else parent,
            "arrival_s": non_negative_number(obj, "timestamp"), "prompt": prompt,
            "output": non_negative_int(obj, "output_length"), "type": obj["type"],
            "turn": non_negative_int(obj, "turn"),
            "hashes": hash_list(obj, "hash_ids", expected, f"ceil(input_length/{self.block_tokens})"),
        }

    def _with_sessions(self, rows: list[dict]) -> Iterator[RequestRecord]:
        root_of: dict[int, int] = {}
        for row in rows:
            parent = row["parent"]
            root = row["chat_id"] if parent is None else root_of.get(parent, parent)
            root_of[row["chat_id"]] = root
            yield RequestRecord(
                request_id=str(row["chat_id"]), arrival_s=row["arrival_s"],
                prompt_tokens=row["prompt"], output_tokens=row["output"],
                block_hashes=row["hashes"], block_size_tokens=self.block_tokens,
                session_id=str(root),
                parent_request_id=None if parent is None else str(parent),
                request_type=row["type"], turn=row["turn"],
            )
