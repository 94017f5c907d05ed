"""`kvtier store`: look after a trace store (summary, Parquet segment export, retention)."""

from __future__ import annotations

import re

SUMMARY = "inspect a DuckDB trace store, export Parquet segments, apply retention"
EXAMPLE = ("kvtier store info kvtier-out/kvtier.duckdb  |  kvtier store export STORE --segments DIR  |  "
           "kvtier store prune STORE --max-age 7d --dry-run")
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
    info = actions.add_parser("info", help="tables, row counts, batches, rejections, time range "
                                           "(read-only: the file is not changed)")
    info.add_argument("store", help="DuckDB store file")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    export = actions.add_parser("export", help="write new rows as immutable hive-partitioned Parquet segments")
    export.add_argument("store", help="DuckDB store file")
    export.add_argument("--segments", required=True, help="segment root folder")
    prune = actions.add_parser("prune", help="delete records older than an age (the batch ledger is kept)")
    prune.add_argument("store", help="DuckDB store file")
    prune.add_argument("--max-age", required=True, type=_duration_arg, help="e.g. 7d, 12h, 3600")
    prune.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    prune.add_argument("--yes", action="store_true",
                       help="delete even when that is every record (refused without it)")
    migrate = actions.add_parser("migrate", help="bring a store written by an older kvtier up to "
                                                 "date (adds the columns it lacks; keeps every row)")
    migrate.add_argument("store", help="DuckDB store file")


def run(args) -> int:
    from pathlib import Path

    from kvtier.collector.store import TraceStore
    from kvtier.errors import KvtierError

    path = Path(args.store)
    if path.is_dir():
        raise KvtierError(f"{path} is a folder, not a store file; give the DuckDB file "
                          "(e.g. kvtier-out/kvtier.duckdb)")
    if not path.is_file():
        raise KvtierError(f"no store at {path} (create one with 'kvtier demo' or 'kvtier collect')")
    read_only = args.action == "info" or (args.action == "prune" and args.dry_run)
    if args.action == "export":
        from kvtier.verbs.checks import output_dir

        output_dir(args.segments, "--segments")
    if args.action == "info":
        return _info_of(path, args)
    with TraceStore(path, read_only=read_only, migrate=args.action == "migrate") as store:
        return _ACTIONS[args.action](store, args)


def _info_of(path, args) -> int:
    """``info`` on the store, or, while a running collector holds it, on the Parquet
    segments that collector exports (said in one line on stderr)."""
    import sys

    from kvtier.collector.segments import segments_of
    from kvtier.collector.store import TraceStore
    from kvtier.collector.storefile import StoreLockedError
    from kvtier.collector.summary import segments_summary

    try:
        with TraceStore(path, read_only=True) as store:
            return _info(store, args)
    except StoreLockedError as locked:
        segments = segments_of(path)
        if segments is None:
            raise
        holder = f"process {locked.pid}" if locked.pid else "another process"
        print(f"kvtier store: note: {path} is held by {holder} (a running collector); "
              f"reading its Parquet segments in {segments} instead (up to their last export)",
              file=sys.stderr, flush=True)
        return _print_summary(segments_summary(segments), args)


def _info(store, args) -> int:
    from kvtier.collector.summary import store_summary

    return _print_summary(store_summary(store), args)


def _print_summary(summary: dict, args) -> int:
    from kvtier.collector import json_text

    if args.json:
        print(json_text.dumps(summary))
        return 0
    for key, value in summary.items():
        print(f"{key:28s} {value}")
    return 0


def _export(store, args) -> int:
    from kvtier.collector.segments import export_segments

    from kvtier.errors import failure

    try:
        result = export_segments(store, args.segments)
    except OSError as error:  # the store is as it was: the export commits only when complete
        raise failure(f"--segments {args.segments}: cannot write segments there "
                      f"({error.strerror or error}); nothing was exported") from None
    print(f"wrote {len(result.files)} segment file(s), {result.total_rows:,} row(s) "
          f"({', '.join(f'{t}: {n:,}' for t, n in result.rows.items())}) under {args.segments}")
    return 0


def _prune(store, args) -> int:
    from kvtier.errors import KvtierError

    would = store.count_older(args.max_age)
    total = store.count("block_events") + store.count("requests")
    what = (f"{would.block_events:,} block event(s) and {would.requests:,} request(s) older "
            f"than {args.max_age:g} s")
    if args.dry_run:
        print(f"dry run: would delete {what}, of {total:,} record(s); nothing deleted")
        return 0
    if total and would.block_events + would.requests == total and not args.yes:
        raise KvtierError(f"--max-age {args.max_age:g}s would delete every record in {store.path} "
                          f"({what}); add --yes to do it, or --dry-run to see counts")
    result = store.prune(args.max_age)
    print(f"deleted {result.block_events:,} block event(s) and {result.requests:,} request(s) "
          f"older than {args.max_age:g} s")
    return 0


def _migrate(store, args) -> int:
    print(f"{store.path} matches this kvtier's schema "
          f"({store.count('block_events'):,} block events, {store.count('requests'):,} requests kept)")
    return 0


_ACTIONS = {"info": _info, "export": _export, "prune": _prune, "migrate": _migrate}
