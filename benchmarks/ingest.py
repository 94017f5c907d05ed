"""Ingest benchmark: recorder -> flusher -> committed rows in a file-backed DuckDB store.

Run: ``python benchmarks/ingest.py --json`` (prints one JSON object; ``--smoke``: tiny
inputs, to check it runs).

Three measurements in one process, on the same rows:

* ``append_p50_us`` / ``append_p99_us``: the cost of one ``Recorder.record`` call, timed
  call by call with ``perf_counter_ns`` (the timer's own cost, ``timer_overhead_ns``, is
  included, so these are upper bounds).
* ``events_per_s``: the collector's ingest rate, from the recorder's buffer to committed
  rows: ``take_events()`` (draining packed records into Arrow batches, validation) and
  idempotent ingest (ledger check + insert + commit per batch) into a DuckDB file.
* ``end_to_end_events_per_s``: the same plus the engine-side ``record`` calls, all on one
  thread, interleaved as a flusher would drain: the total work per event.
* ``raw_rows_per_s``: the same rows, in the same batch sizes, inserted into a fresh DuckDB
  file with a bare ``INSERT ... SELECT`` from a registered Arrow table (no recorder, no
  ledger, no validation). ``ratio_vs_raw`` = events_per_s / raw_rows_per_s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from kvtier.collector.ddl import BLOCK_EVENTS_TABLE, create_table, enum_types  # noqa: E402
from kvtier.collector.events import Origin, Outcome, Tier  # noqa: E402
from kvtier.collector.recorder import Recorder  # noqa: E402
from kvtier.collector.store import TraceStore  # noqa: E402

# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("batch_events", "append_p50_us", "append_p99_us", "timer_overhead_ns", "events",
           "stored_rows", "dropped", "events_per_s", "end_to_end_events_per_s", "raw_rows_per_s",
           "ratio_vs_raw")
SMOKE = {"events": 20_000, "batch_events": 4096, "append_samples": 2000}  # --smoke's sizes

LOOKUPS = (Outcome.GPU_HIT, Outcome.CPU_PROMOTION, Outcome.COLD_PROMOTION, Outcome.RECOMPUTE_MISS)
FROM_TIER = {Outcome.GPU_HIT: None, Outcome.CPU_PROMOTION: Tier.CPU,
             Outcome.COLD_PROMOTION: Tier.COLD, Outcome.RECOMPUTE_MISS: None}


def workload(n: int, seed: int) -> list[tuple]:
    """Realistic lookup events: requests of 8-256 blocks, prefix-chained hashes."""
    rng = np.random.default_rng(seed)
    rows = []
    request = 0
    while len(rows) < n:
        blocks = int(rng.integers(8, 256))
        request_id = f"cmpl-{request:08x}-0"
        base = int(rng.integers(0, 2**63))
        outcomes = rng.integers(0, 4, size=blocks)
        for position in range(blocks):
            kind = LOOKUPS[outcomes[position]]
            block_hash = (base + position * 7919) % 2**64
            parent = None if position == 0 else (base + (position - 1) * 7919) % 2**64
            rows.append((kind, block_hash, request_id, parent, position, 16, 131072,
                         FROM_TIER[kind], Tier.GPU, None, 0.0002 * (int(kind) + 1)))
        request += 1
    return rows[:n]


def bench_append(origin: Origin, rows: list[tuple], samples: int) -> dict:
    recorder = Recorder(origin, capacity_events=samples + 1)
    record = recorder.record
    clock = time.perf_counter_ns
    costs = np.empty(samples, dtype=np.int64)
    for i in range(samples):
        row = rows[i % len(rows)]
        start = clock()
        record(*row)
        costs[i] = clock() - start
    empty = np.empty(samples, dtype=np.int64)
    for i in range(samples):
        start = clock()
        empty[i] = clock() - start
    return {
        "append_p50_us": float(np.percentile(costs, 50)) / 1e3,
        "append_p99_us": float(np.percentile(costs, 99)) / 1e3,
        "timer_overhead_ns": float(np.percentile(empty, 50)),
    }


def bench_pipeline(origin: Origin, rows: list[tuple], batch_events: int, path: Path) -> tuple[dict, list]:
    store = TraceStore(path)
    recorder = Recorder(origin, capacity_events=batch_events * 2)
    batches = []
    record = recorder.record
    start = time.perf_counter()
    drain_s = 0.0
    for offset in range(0, len(rows), batch_events):
        for row in rows[offset:offset + batch_events]:
            record(*row)
        t0 = time.perf_counter()
        batch = recorder.take_events()
        store.ingest(batch)
        drain_s += time.perf_counter() - t0
        batches.append(batch.block_events)
    elapsed = time.perf_counter() - start
    stored = store.count(BLOCK_EVENTS_TABLE)
    store.close()
    return {
        "events": len(rows),
        "stored_rows": stored,
        "dropped": recorder.dropped_events,
        "events_per_s": stored / drain_s,
        "end_to_end_events_per_s": stored / elapsed,
    }, batches


def bench_raw(batches: list[pa.Table], path: Path) -> dict:
    con = duckdb.connect(str(path))
    for statement in enum_types():
        con.execute(statement)
    con.execute(create_table(BLOCK_EVENTS_TABLE))
    names = ", ".join(batches[0].column_names)
    start = time.perf_counter()
    for table in batches:
        con.register("_raw", table)
        con.execute(f"INSERT INTO {BLOCK_EVENTS_TABLE} ({names}, batch_id) SELECT *, 0 FROM _raw")
        con.unregister("_raw")
    elapsed = time.perf_counter() - start
    rows = con.execute(f"SELECT count(*) FROM {BLOCK_EVENTS_TABLE}").fetchall()[0][0]
    con.close()
    return {"raw_rows_per_s": rows / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--batch-events", type=int, default=262_144)
    parser.add_argument("--append-samples", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, seconds: checks the "
                        "benchmark runs (its figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)

    origin = Origin("bench", "bench-0", f"bench-{os.getpid()}")
    rows = workload(args.events, args.seed)
    figures = {"batch_events": args.batch_events}
    figures.update(bench_append(origin, rows, args.append_samples))
    with tempfile.TemporaryDirectory() as tmp:
        pipeline, batches = bench_pipeline(origin, rows, args.batch_events, Path(tmp) / "store.duckdb")
        figures.update(pipeline)
        figures.update(bench_raw(batches, Path(tmp) / "raw.duckdb"))
    figures["ratio_vs_raw"] = figures["events_per_s"] / figures["raw_rows_per_s"]
    if args.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))
    else:
        for key, value in figures.items():
            print(f"{key:32s} {value:,.3f}" if isinstance(value, float) else f"{key:32s} {value}")


if __name__ == "__main__":
    main()
