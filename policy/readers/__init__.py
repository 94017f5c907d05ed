"""Trace readers: public trace formats as :class:`kvtier.collector.events.TraceReader` values.

``open_trace(path, format=None)`` picks the reader by name or sniffs the format from the path
and its first record. Each reader yields ``RequestRecord`` values in arrival order.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvtier.policy.readers.bailian import BailianReader
from kvtier.policy.readers.base import TraceFormatError, open_text
from kvtier.policy.trace_formats import FORMATS, READER_CLASSES
from kvtier.policy.readers.lmcache_lookups import FILE_GLOB as LMCACHE_GLOB, LmcacheReader
from kvtier.policy.readers.mooncake import MooncakeReader
from kvtier.policy.readers.weka import WekaLayout, WekaReader

READERS = {name: globals()[cls] for name, cls in READER_CLASSES.items()}

__all__ = [
    "FORMATS",
    "BailianReader",
    "LmcacheReader",
    "MooncakeReader",
    "TraceFormatError",
    "WekaLayout",
    "WekaReader",
    "open_trace",
    "sniff_format",
]


def open_trace(path: str | Path, format: str | None = None, *, skip_bad: bool = False,
               block_tokens: int | None = None, instance: str | None = None,
               tier_config_id: str | None = None, engine: str | None = None):
    """A reader for ``path``; ``format`` is one of :data:`FORMATS` or ``None`` to sniff.
    ``instance`` keeps one serving instance of a store or segment folder (others have one);
    ``tier_config_id`` and ``engine`` keep the requests of one tier configuration and of
    origins of one engine (a store or segment folder only).

    ``block_tokens`` overrides the format's block size (Mooncake, Bailian; LMCache's logs
    carry theirs, which it must match). Raises
    ``FileNotFoundError`` for a missing path and :class:`TraceFormatError` for an unknown
    format, naming the allowed ones.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    name = format or sniff_format(path)
    if name == "store":
        return _store_reader(path, instance, tier_config_id, engine)
    if instance is not None:
        raise TraceFormatError(path, None, f"a {name} trace has no instances; --instance "
                                           "needs a store or a folder of segments")
    if name not in READERS:
        raise TraceFormatError(path, None, f"unknown trace format {name!r}; allowed: "
                                           f"{', '.join(FORMATS)}")
    if name == "weka":
        return WekaReader(path, skip_bad=skip_bad)
    extra = {} if block_tokens is None else {"block_tokens": block_tokens}
    return READERS[name](path, skip_bad=skip_bad, **extra)


def _store_reader(path: Path, instance: str | None = None, tier_config_id: str | None = None,
                  engine: str | None = None):
    """The store readers: a folder of Parquet segments or a DuckDB store file (read-only)."""
    from kvtier.collector.reader import SegmentReader, open_store  # DuckDB: imported on use

    if path.is_dir():
        return SegmentReader(path, instance=instance, tier_config_id=tier_config_id,
                             engine=engine)
    if path.suffix == ".parquet":
        raise TraceFormatError(path, None, "a single Parquet file; pass the folder of segments "
                                           "(what kvtier collect --segments or kvtier store "
                                           "export writes)")
    return open_store(path, instance=instance, tier_config_id=tier_config_id, engine=engine)


def sniff_format(path: Path) -> str:
    """The trace format of ``path`` from its name and first record."""
    if path.is_dir():
        if any(path.glob(LMCACHE_GLOB)):
            return "lmcache"
        if any(path.glob("*.json")):
            return "weka"
        if any(path.glob("*.duckdb")) or any(path.rglob("*.parquet")):
            return "store"
        raise TraceFormatError(path, None, "folder holds no *.json conversations, "
                                           f"{LMCACHE_GLOB}, *.duckdb or *.parquet; allowed "
                                           f"formats: {', '.join(FORMATS)}")
    name = path.name
    if name.endswith((".tar.gz", ".tgz", ".tar", ".json")):
        return "weka"
    if name.endswith((".duckdb", ".parquet")):
        return "store"
    return _sniff_jsonl(path)


def _sniff_jsonl(path: Path) -> str:
    try:
        with open_text(path) as handle:
            first = next((line for line in handle if line.strip()), "")
        obj = json.loads(first) if first else None
    except (UnicodeDecodeError, json.JSONDecodeError, OSError, EOFError) as error:
        raise TraceFormatError(path, 1, f"cannot detect the trace format ({error}); pass "
                                        f"--format, one of {', '.join(FORMATS)}") from None
    if isinstance(obj, dict) and "chat_id" in obj:
        return "bailian"
    if isinstance(obj, dict) and {"timestamp", "input_length", "hash_ids"} <= obj.keys():
        return "mooncake"
    if isinstance(obj, dict) and {"chunk_hashes", "seq_len", "chunk_size"} <= obj.keys():
        return "lmcache"
    raise TraceFormatError(path, 1, "first record matches no known trace format; allowed: "
                                    f"{', '.join(FORMATS)}")
