"""LMCache's lookup-hash logs: what ``lmcache server --lookup-hash-log-dir DIR`` writes.

One JSON object per lookup, in rotating files ``DIR/lookup_hashes_<time>_<n>.jsonl``
(LMCache 0.5.6, ``lmcache/v1/mp_observability/subscribers/logging/lookup_hash.py``)::

    {"timestamp": 1711929600.123, "request_id": "req-abc", "model_name": "m",
     "chunk_size": 256, "seq_len": 1025, "dtypes": ["torch.float16"],
     "shapes": [[2, 32, 256, 1024]], "chunk_hashes": ["0xd653...", ...]}

``chunk_hashes`` are the prompt's prefix-chained hashes of its *full* chunks in hex (LMCache
caches no partial chunk, so the ``seq_len % chunk_size`` tail tokens have none and are always
recomputed). kvtier keeps each hash's low 64 bits as the block id (the hashes are
cryptographic; a hash of at most 64 bits is kept whole). A folder is read as LMCache's own
cache simulator reads it: every ``lookup_hashes_*.jsonl`` in it, by name, then all lookups by
timestamp (ties keep file order).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from kvtier.collector.events import UINT64_MAX, RequestRecord
from kvtier.policy.readers.base import (
    BadLine,
    JsonLinesReader,
    TraceFormatError,
    check_fields,
    iter_json_lines,
    non_negative_int,
    non_negative_number,
)

FIELDS = frozenset({"timestamp", "request_id", "chunk_size", "seq_len", "chunk_hashes"})
OPTIONAL = frozenset({"model_name", "dtypes", "shapes"})
FILE_GLOB = "lookup_hashes_*.jsonl"


class LmcacheReader(JsonLinesReader):
    """Reads an LMCache lookup-hash log (a file, or the folder LMCache writes) as request
    records: ``arrival_s`` is the lookup's ``timestamp``, ``prompt_tokens`` its ``seq_len``,
    ``block_size_tokens`` its ``chunk_size`` (``block_tokens``, when given, must match it);
    output tokens unknown. ``skipped`` counts the bad lines of the last pass."""

    format_name = "lmcache"

    def __init__(self, path: str | Path, *, block_tokens: int | None = None,
                 skip_bad: bool = False) -> None:
        super().__init__(path, block_tokens=block_tokens or 1, skip_bad=skip_bad)
        self._wanted_chunk = block_tokens
        self.files = self._files()

    def _files(self) -> tuple[Path, ...]:
        if not self.path.is_dir():
            return (self.path,)
        files = tuple(sorted(self.path.glob(FILE_GLOB)))
        if not files:
            raise TraceFormatError(self.path, None, f"folder holds no {FILE_GLOB} files (what "
                                                    "lmcache server --lookup-hash-log-dir writes)")
        return files

    def requests(self) -> Iterator[RequestRecord]:
        self.skipped = 0
        records = []
        for file in self.files:
            for line, obj in iter_json_lines(file):
                try:
                    if isinstance(obj, BadLine):
                        raise obj
                    records.append(self._record(line, obj))
                except BadLine as problem:
                    self._bad(file, line, str(problem))
        records.sort(key=lambda r: r.arrival_s)  # stable: ties keep file order
        return iter(records)

    def _record(self, line: int, obj: dict) -> RequestRecord:
        check_fields(obj, FIELDS, OPTIONAL)
        chunk = non_negative_int(obj, "chunk_size")
        if chunk == 0:
            raise BadLine("chunk_size must be > 0, got 0")
        if self._wanted_chunk is not None and chunk != self._wanted_chunk:
            raise BadLine(f"chunk_size {chunk} differs from the block size asked for "
                          f"({self._wanted_chunk}); leave --block-tokens out for LMCache logs")
        prompt = non_negative_int(obj, "seq_len")
        hashes = _block_ids(obj["chunk_hashes"], math.ceil(prompt / chunk))
        model = obj.get("model_name")
        return RequestRecord(
            request_id=str(obj["request_id"]),
            arrival_s=non_negative_number(obj, "timestamp"),
            prompt_tokens=prompt,
            block_hashes=hashes,
            block_size_tokens=chunk,
            model=model if isinstance(model, str) and model else None,
        )


def _block_ids(values, most: int) -> tuple[int, ...]:
    """The hex hashes' low 64 bits; at most ``most`` of them (ceil(seq_len / chunk_size))."""
    if not isinstance(values, list):
        raise BadLine(f"chunk_hashes must be a list of hex strings, got {type(values).__name__}")
    if len(values) > most:
        raise BadLine(f"chunk_hashes has {len(values)} hashes but seq_len covers {most} chunks")
    ids = []
    for value in values:
        try:
            if not isinstance(value, str):
                raise ValueError
            ids.append(int(value, 16) & UINT64_MAX)
        except ValueError:
            raise BadLine(f"chunk_hashes holds {value!r}; expected hex strings such as "
                          "'0xd65391f7'") from None
    return tuple(ids)
