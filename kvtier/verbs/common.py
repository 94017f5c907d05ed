"""What the policy verbs share: opening a trace, peeking its block size, parsing capacities."""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from kvtier.collector.events import RequestRecord
from kvtier.errors import KvtierError
from kvtier.progress import track
from kvtier.policy.geometry import KVGeometry, geometry, geometry_for, parse_capacity_tokens
from kvtier.policy.readers import WekaLayout, WekaReader, open_trace


DEFAULT_MODEL = "llama-3.1-8b"


def open_records(args, flag: str | None = None) -> tuple[object, Iterator[RequestRecord]]:
    """The reader and its records (with a progress bar) for ``args.trace``; the records raise
    ``KvtierError`` when the trace turns out to hold none."""
    if not args.trace:
        raise KvtierError("--trace is required: a Mooncake/Bailian JSONL, a WEKA .tar.gz or "
                          "folder, or a store")
    if args.weka_start_gap_s < 0:
        raise KvtierError(f"--weka-start-gap-s must be >= 0, got {args.weka_start_gap_s}")
    if args.block_tokens is not None and args.block_tokens < 1:
        raise KvtierError(f"--block-tokens must be >= 1, got {args.block_tokens}")
    if not Path(args.trace).exists():
        flag = flag or ("--store" if getattr(args, "store", None) == args.trace else "--trace")
        raise KvtierError(f"{flag} {args.trace}: no such file or folder")
    instance = getattr(args, "instance", None)
    select = {"tier_config_id": getattr(args, "tier_config", None),
              "engine": getattr(args, "source_engine", None)}
    reader = open_trace(args.trace, args.format, skip_bad=args.skip_bad,
                        block_tokens=args.block_tokens, instance=instance, **select)
    if any(select.values()) and not hasattr(reader, "tier_config_id"):
        raise KvtierError("--tier-config and --source-engine select the requests of a store "
                          "(--store DB, or a store or segment folder as --trace)")
    if getattr(reader, "note", None):  # e.g. a locked store read through its segments
        print(f"kvtier {args.verb}: note: {reader.note}", file=sys.stderr, flush=True)
    if isinstance(reader, WekaReader):
        reader.layout = WekaLayout(start_gap_s=args.weka_start_gap_s)
    where = args.trace if instance is None else f"{args.trace} (instance {instance})"
    return reader, _some(track(reader.requests(), f"reading {where}"), where, reader)


def _some(records: Iterable[RequestRecord], path, reader) -> Iterator[RequestRecord]:
    """``records``, raising at their end if there were none: an empty trace is bad input, not
    a report of zeros."""
    count = 0
    for record in records:
        count += 1
        yield record
    if count == 0:
        skipped = getattr(reader, "skipped", 0)
        why = f"all {skipped} lines were bad and skipped" if skipped else "it holds no requests"
        raise KvtierError(f"{path}: no requests to work on ({why}); give a trace with requests "
                          "(check --format, or the file is empty)")


def peek_block_tokens(records: Iterator[RequestRecord], default: int = 16
                      ) -> tuple[int, Iterable[RequestRecord]]:
    """The first record's block size, and the records with that one put back."""
    first = next(records, None)
    if first is None:
        return default, iter(())
    return first.block_size_tokens or default, itertools.chain([first], records)


def check_subset(args) -> None:
    """``--max-requests`` and ``--coarsen``, before a trace is read."""
    if args.max_requests is not None and args.max_requests < 1:
        raise KvtierError(f"--max-requests must be >= 1, got {args.max_requests}")
    if args.coarsen < 1:
        raise KvtierError(f"--coarsen must be >= 1 (1: blocks as they are), got {args.coarsen}")


def model_geometry(name: str | None) -> KVGeometry:
    """The KV geometry for costs: ``--model`` (``given``), or the default when it is not given."""
    try:
        return replace(geometry(name), source="given") if name else geometry(DEFAULT_MODEL)
    except ValueError as error:
        raise KvtierError(f"--model: {error}") from None


def kv_geometry(args, reader=None, block_tokens: int = 16) -> KVGeometry:
    """The KV geometry, first found of: ``--kv-bytes-per-token``, ``--model``, the bytes the
    engine's block events recorded behind ``reader`` (a store or segments), the default
    model's (its ``source`` says ``default``; reports name it)."""
    per_token = getattr(args, "kv_bytes_per_token", None)
    if per_token is not None and getattr(args, "model", None):
        raise KvtierError("give --model or --kv-bytes-per-token, not both")
    if per_token is not None:
        try:
            return geometry_for(per_token, "--kv-bytes-per-token", "given")
        except ValueError as error:
            raise KvtierError(f"--kv-bytes-per-token: {error}") from None
    if getattr(args, "model", None):
        return model_geometry(args.model)
    if reader is not None:
        from kvtier.policy.geometry import recorded_bytes_per_token

        recorded = recorded_bytes_per_token(reader, block_tokens)
        if recorded is not None:
            return recorded
    return model_geometry(None)


def capacity_model(args, model: KVGeometry | None = None) -> KVGeometry | None:
    """The geometry byte capacities (16GiB) convert with: one the user gave or the engine
    measured (``model``), never the default, so a byte size never silently assumes one."""
    if model is not None:
        return model if model.source != "default" else None
    return model_geometry(args.model) if args.model else None


def cost_params_file(path: str | None, base):
    """``base`` with the parameters a ``--cost-params`` file (``kvtier calibrate --out``, or
    a probe's ``--out``) holds; its KV bytes per token replace ``base``'s geometry."""
    if not path:
        return base
    from kvtier.policy.cost import measured_cost_params

    try:
        body = json.loads(Path(path).read_text())
        if not isinstance(body, dict) or not isinstance(body.get("cost_params"), dict):
            raise ValueError("it has no cost_params object")
        per_token = body.get("kv_bytes_per_token")
        if per_token:
            base = replace(base, model=geometry_for(int(per_token), f"kvtier calibrate ({path})",
                                                    "calibrated"))
        return measured_cost_params(body, base=base)
    except (OSError, ValueError, TypeError) as error:
        raise KvtierError(f"--cost-params {path}: {getattr(error, 'strerror', None) or error}; "
                          "give the file kvtier calibrate --out wrote") from None


def capacity_blocks(text: str | None, block_tokens: int, model: KVGeometry | None, flag: str,
                    absent: int | None = 0) -> int | None:
    """Blocks for a capacity flag (tokens, suffixes, bytes with ``model``, or inf): ``0`` is no
    tier, ``None`` unlimited; a size under one block is refused rather than rounded to 0."""
    if text is None:
        return absent
    try:
        tokens = parse_capacity_tokens(text, model)
    except ValueError as error:
        if "in bytes" in str(error):
            raise KvtierError(f"{flag} {text} is in bytes: pass --model or --kv-bytes-per-token "
                              "(the KV geometry that converts bytes to tokens, e.g. "
                              "llama-3.1-8b), or give tokens, e.g. 1M") from None
        raise KvtierError(f"{flag}: {error}") from None
    if math.isinf(tokens):
        return None
    if 0 < tokens < block_tokens or (tokens == 0 and any(d in text for d in "123456789")):
        raise KvtierError(f"{flag} {text} is less than one {block_tokens}-token block; give at "
                          f"least {block_tokens} tokens (or 0 for no tier)")
    return int(tokens // block_tokens)


def print_json(obj: dict) -> None:
    """``obj`` on stdout as one line of strict JSON (a NaN or infinity is null)."""
    from kvtier.collector import json_text

    sys.stdout.write(json_text.dumps(obj) + "\n")
