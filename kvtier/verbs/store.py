"""`kvtier store`: look after a trace store (summary, Parquet segment export, retention)."""

from __future__ import annotations

import re

SUMMARY = "inspect a DuckDB trace store, export Parquet segments, apply retention"
EXAMPLE = "kvtier store info kvtier-out/kvtier.duckdb  |  kvtier store export STORE --segments DIR  |  kvtier store prune STORE --max-age 7d"
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration_s(text: str) -> float:
    """'90s', '30m', '12h', '7d' or plain seconds -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise ValueError(f"bad duration {text!r}; use e.g. 90s, 30m, 12h or 7d")
    return float(match.group(1)) * _UNITS_S[match.group(2) or "s"]


def _duration_arg(text: str) -> float:
    import argparse

    try:
        return parse_duration_s(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = actions.add_parser("info", help="tables, row counts, batches, rejections, time range")
    info.add_argument("store", help="DuckDB store file")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    export = actions.add_parser("export", help="write new rows as immutable hive-partitioned Parquet segments")
    export.add_argument("store", help="DuckDB store file")
    export.add_argument("--segments", required=True, help="segment root folder")
    prune = actions.add_parser("prune", help="delete records older than an age (the batch ledger is kept)")
    prune.add_argument("store", help="DuckDB store file")
    prune.add_argument("--max-age", required=True, type=_duration_arg, help="e.g. 7d, 12h, 3600")


def run(args) -> int:
    from pathlib import Path

    from kvtier.errors import KvtierError

    if not Path(args.store).is_file():
        raise KvtierError(f"no store at {args.store} (create one with 'kvtier demo' or 'kvtier collect')")
    from collector.store import TraceStore

    try:
        store = TraceStore(args.store)
    except Exception as error:  # duckdb.IOException on a lock, or not a DuckDB file
        raise KvtierError(f"cannot open {args.store}: {str(error).splitlines()[0]}") from error
    with store:
        return _ACTIONS[args.action](store, args)


def _info(store, args) -> int:
    import json

    from collector.summary import store_summary

    summary = store_summary(store)
    if args.json:
        print(json.dumps(summary))
        return 0
    for key, value in summary.items():
        print(f"{key:28s} {value}")
    return 0


def _export(store, args) -> int:
    from collector.segments import export_segments

    result = export_segments(store, args.segments)
    print(f"wrote {len(result.files)} segment file(s), {result.total_rows:,} row(s) "
          f"({', '.join(f'{t}: {n:,}' for t, n in result.rows.items())}) under {args.segments}")
    return 0


def _prune(store, args) -> int:
    result = store.prune(args.max_age)
    print(f"deleted {result.block_events:,} block event(s) and {result.requests:,} request(s) "
          f"older than {args.max_age:g} s")
    return 0


_ACTIONS = {"info": _info, "export": _export, "prune": _prune}
