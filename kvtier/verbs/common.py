"""What the policy verbs share: opening a trace, peeking its block size, parsing capacities."""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Iterable, Iterator

from collector.events import RequestRecord
from kvtier.errors import KvtierError
from kvtier.progress import track
from policy.geometry import KVGeometry, geometry, parse_capacity_tokens
from policy.readers import WekaLayout, WekaReader, open_trace


def open_records(args) -> tuple[object, Iterator[RequestRecord]]:
    """The reader and its records (with a progress bar) for ``args.trace``."""
    if not args.trace:
        raise KvtierError("--trace is required: a Mooncake/Bailian JSONL, a WEKA .tar.gz or "
                          "folder, or a store")
    if args.weka_start_gap_s < 0:
        raise KvtierError(f"--weka-start-gap-s must be >= 0, got {args.weka_start_gap_s}")
    reader = open_trace(args.trace, args.format, skip_bad=args.skip_bad,
                        block_tokens=args.block_tokens)
    if getattr(reader, "note", None):  # e.g. a locked store read through its segments
        print(f"kvtier {args.verb}: note: {reader.note}", file=sys.stderr, flush=True)
    if isinstance(reader, WekaReader):
        reader.layout = WekaLayout(start_gap_s=args.weka_start_gap_s)
    return reader, track(reader.requests(), f"reading {args.trace}")


def peek_block_tokens(records: Iterator[RequestRecord], default: int = 16
                      ) -> tuple[int, Iterable[RequestRecord]]:
    """The first record's block size, and the records with that one put back."""
    first = next(records, None)
    if first is None:
        return default, iter(())
    return first.block_size_tokens or default, itertools.chain([first], records)


def model_geometry(name: str) -> KVGeometry:
    try:
        return geometry(name)
    except ValueError as error:
        raise KvtierError(str(error)) from None


def capacity_blocks(text: str | None, block_tokens: int, model: KVGeometry, flag: str,
                    absent: int | None = 0) -> int | None:
    """Blocks for a capacity flag (tokens, suffixes, bytes with the model, or inf)."""
    if text is None:
        return absent
    try:
        tokens = parse_capacity_tokens(text, model)
    except ValueError as error:
        raise KvtierError(f"{flag}: {error}") from None
    return None if math.isinf(tokens) else int(tokens // block_tokens)


def print_json(obj: dict) -> None:
    json.dump(obj, sys.stdout, default=_jsonable)
    sys.stdout.write("\n")


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and math.isinf(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
