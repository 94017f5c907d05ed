"""Dashboard benchmark: the overview page's first render over 10 million block events.

Run: ``python benchmarks/dashboard.py --json`` (prints one JSON object; ``--events`` to
change the size; ``--segments DIR`` keeps the built segments and reuses them next time, so
a re-measurement skips the build; ``--smoke``: tiny inputs, to check it runs).

1. Builds the data the real way: synthetic but realistic block events (requests of 16-240
   blocks, shared prefixes, a three-phase rollout GPU-only -> +CPU -> +cold, per-kind
   latencies) and their request records are generated with numpy as Arrow batches, ingested
   into a file-backed ``TraceStore`` and exported with ``export_segments`` (``build_s``).
2. Starts a collector process that keeps ingesting batches into a *separate* store file
   while the dashboard is measured.
3. ``first_render_s``: one Streamlit ``AppTest`` run of the overview page (``dashboard/app.py``)
   over the segments, from a fresh script run: opening the segments, the facets and
   hit-quality queries, building the charts. It is the first query over the segment files in
   this process (the OS page cache may hold them from the export, as it would in service).
   ``overview_queries_s`` times the same queries again without Streamlit.
4. ``collector_batches_during_render`` counts the batches the collector committed while the
   page rendered (from its ledger's ``ingested_at_s``): the render did not stop the writes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from kvtier.collector.batch import EventBatch  # noqa: E402
from kvtier.collector.columns import columns_table  # noqa: E402
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord, Tier  # noqa: E402
from kvtier.collector.segments import export_segments  # noqa: E402
from kvtier.collector.store import TraceStore  # noqa: E402

PHASES = ("gpu-only", "gpu+cpu", "gpu+cpu+cold")
# Outcome probabilities (gpu_hit, cpu_promotion, cold_promotion, recompute_miss) per phase.
PHASE_MIX = np.array([[0.45, 0.0, 0.0, 0.55], [0.45, 0.25, 0.0, 0.30], [0.45, 0.25, 0.15, 0.15]])
KINDS = (Outcome.GPU_HIT, Outcome.CPU_PROMOTION, Outcome.COLD_PROMOTION, Outcome.RECOMPUTE_MISS)
LATENCY_S = np.array([0.0, 0.002, 0.02, 0.01])
BLOCK_TOKENS, BLOCK_BYTES = 16, 2 * 1024 * 1024
MODEL = "bench/model-8b"
# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("first_render_s", "charts_rendered", "overview_queries_s", "facets_s",
           "events_seen_by_dashboard", "overview_points", "collector_batches_during_render")
SMOKE = {"events": 20_000, "instances": 2}  # --smoke's sizes


def chunk(rng, first_request: int, requests: int, total_requests: int, t0_s: float, span_s: float
          ) -> tuple[pa.Table, pa.Table]:
    """Block events and request records for ``requests`` consecutive requests, as the
    schema's tables (``columns_table``: a field the benchmark does not model is null)."""
    index = np.arange(first_request, first_request + requests)
    blocks = rng.integers(16, 241, size=requests)
    starts = np.repeat(np.cumsum(blocks) - blocks, blocks)
    owner = np.repeat(np.arange(requests), blocks)
    position = (np.arange(owner.size) - starts).astype(np.int32)
    arrival = t0_s + index * (span_s / total_requests)
    phase = index * len(PHASES) // total_requests
    mix = PHASE_MIX[phase[owner]].cumsum(axis=1)
    kind = (rng.random(owner.size)[:, None] > mix).sum(axis=1).clip(0, 3)
    prefix = rng.zipf(1.5, size=requests) % 500
    shared = position < rng.integers(0, 48, size=requests)[owner]
    seed = np.where(shared, prefix[owner], index[owner] + 1_000_000).astype(np.uint64)
    block_hash = seed * np.uint64(0x9E3779B97F4A7C15) + position.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
    names = pa.array([f"r{i}" for i in index])
    promoted_from = np.where(kind == 2, int(Tier.COLD), int(Tier.CPU))
    events, dropped = columns_table(BlockEvent, {
        "time_s": arrival[owner] + position * 1e-5, "kind": np.array([int(k) for k in KINDS])[kind],
        "block_hash": block_hash, "request_id": names.take(pa.array(owner)),
        "parent_hash": np.roll(block_hash, 1), "position": position,
        "tokens": np.full(owner.size, BLOCK_TOKENS), "size_bytes": np.full(owner.size, BLOCK_BYTES),
        "tier_from": promoted_from, "tier_to": np.full(owner.size, int(Tier.GPU)),
        "latency_s": LATENCY_S[kind] * rng.lognormal(0.0, 0.5, size=owner.size),
    }, nulls={"parent_hash": position == 0, "tier_from": (kind != 1) & (kind != 2)})
    return schema_valid(events, dropped), requests_table(rng, names, arrival, blocks, owner, kind, phase)


def requests_table(rng, names, arrival, blocks, owner, kind, phase) -> pa.Table:
    n = len(blocks)
    tokens = np.stack([np.bincount(owner[kind == k], minlength=n) * BLOCK_TOKENS for k in range(4)])
    output = rng.integers(16, 512, size=n)
    hit_limit = rng.random(n) < 0.2  # a fifth run to the output limit, the rest stop
    table, dropped = columns_table(RequestRecord, {
        "request_id": names, "arrival_s": arrival, "prompt_tokens": blocks * BLOCK_TOKENS,
        "output_tokens": output, "block_hashes": [[] for _ in range(n)],
        "block_size_tokens": np.full(n, BLOCK_TOKENS),
        "gpu_hit_tokens": tokens[0], "cpu_promotion_tokens": tokens[1], "cold_promotion_tokens": tokens[2],
        "recomputed_tokens": tokens[3], "ttft_s": 0.05 + tokens[3] * 2e-5 * rng.lognormal(0, 0.3, size=n),
        "itl_s": 0.02 * rng.lognormal(0, 0.2, size=n), "e2e_latency_s": np.full(n, 2.0),
        "tier_config_id": np.array(PHASES, dtype=object)[phase],
        "finish_status": np.where(hit_limit, "length", "stopped").astype(object),
        "model": np.full(n, MODEL, dtype=object),
    })
    return schema_valid(table, dropped)


def schema_valid(table: pa.Table, dropped) -> pa.Table:
    """The generated rows, all of them: a row the schema rejects is the benchmark's bug."""
    if dropped:
        raise RuntimeError(f"the schema rejects generated rows: {dict(dropped)}")
    return table


def build(root: Path, store_path: Path, events: int, instances: int, seed: int) -> dict:
    """Ingest ``events`` block events (about 128 per request) and export them as segments."""
    rng = np.random.default_rng(seed)
    total_requests = max(1, events // 128)
    per_chunk = 8192
    t0_s, span_s = time.time() - 6 * 3600, 6 * 3600.0
    started = time.perf_counter()
    stored = 0
    with TraceStore(store_path) as store:
        store.run_locked(lambda con: con.execute("SET enable_progress_bar = false"))  # keep stdout JSON
        for number, first in enumerate(range(0, total_requests, per_chunk)):
            count = min(per_chunk, total_requests - first)
            block_events, requests = chunk(rng, first, count, total_requests, t0_s, span_s)
            instance = f"node-{number % instances}"
            origin = Origin("vllm", instance, f"{instance}/bench")
            stored += store.ingest(EventBatch(origin, number, block_events, requests)).block_events
        exported = export_segments(store, root)
    return {"events": stored, "requests": total_requests, "segment_files": len(exported.files),
            "segment_bytes": sum(p.stat().st_size for p in exported.files),
            "build_s": time.perf_counter() - started}


def collector(store_path: Path, batch_requests: int) -> None:
    """The collector process: ingest a batch every 50 ms until SIGTERM."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    rng = np.random.default_rng(1)
    origin = Origin("vllm", "live", "live/bench")
    with TraceStore(store_path) as store:
        print("READY", flush=True)
        sequence = 0
        while not stop:
            events, requests = chunk(rng, sequence * batch_requests, batch_requests, 10**6, time.time(), 1.0)
            store.ingest(EventBatch(origin, sequence, events, requests))
            sequence += 1
            time.sleep(0.05)


def render_overview(root: Path) -> dict:
    from streamlit.testing.v1 import AppTest

    from kvtier import dashboard
    os.environ["KVTIER_DASHBOARD_SEGMENTS"] = str(root)
    at = AppTest.from_file(str(Path(dashboard.__file__).with_name("app.py")), default_timeout=120)
    at.query_params["page"] = "overview"
    started = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - started
    if at.exception:
        raise RuntimeError(f"overview raised: {at.exception[0].value}")
    return {"first_render_s": elapsed, "charts_rendered": len(at.get("vega_lite_chart")),
            "render_window": (time.time() - elapsed, time.time())}


def overview_queries(root: Path) -> dict:
    from kvtier.dashboard import queries
    from kvtier.dashboard.data import Filters, SegmentData
    from kvtier.dashboard.facets import read_facets

    started = time.perf_counter()
    with SegmentData(root) as data:
        facets = read_facets(data)
        facets_s = time.perf_counter() - started
        frame, _ = queries.hit_quality(data, Filters(), (facets.start_s, facets.end_s))
    return {"overview_queries_s": time.perf_counter() - started, "facets_s": facets_s,
            "events_seen_by_dashboard": facets.block_events, "overview_points": len(frame)}


def batches_between(store_path: Path, window: tuple[float, float]) -> int:
    con = duckdb.connect(str(store_path), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM ingested_batches WHERE ingested_at_s BETWEEN ? AND ?",
                           list(window)).fetchall()[0][0]
    finally:
        con.close()


def measure(args, tmp: Path) -> dict:
    segments = Path(args.segments) if args.segments else tmp / "segments"
    if (segments / "block_events").is_dir():
        figures = {"reused_segments": str(segments)}  # built by an earlier run: measure only
    else:
        figures = build(segments, tmp / "store.duckdb", args.events, args.instances, args.seed)
    live = tmp / "live.duckdb"
    child = subprocess.Popen([sys.executable, __file__, "--collector", str(live)],
                             stdout=subprocess.PIPE, text=True)
    try:
        if child.stdout.readline().strip() != "READY":
            raise RuntimeError("collector process did not start")
        time.sleep(0.5)
        render = render_overview(segments)
        figures.update(overview_queries(segments))
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
    window = render.pop("render_window")
    figures.update(render, collector_batches_during_render=batches_between(live, window))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--segments", help="build the segments here and keep them; if they exist, "
                        "skip the build and measure only")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, seconds: checks the "
                        "benchmark runs (its figures mean nothing)")
    parser.add_argument("--collector", help=argparse.SUPPRESS)  # internal: run as the collector
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.collector:
        collector(Path(args.collector), batch_requests=64)
        return
    with tempfile.TemporaryDirectory() as tmp:
        figures = measure(args, Path(tmp))
    if args.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))
    else:
        for key, value in figures.items():
            print(f"{key:34s} {value:,.3f}" if isinstance(value, float) else f"{key:34s} {value}")


if __name__ == "__main__":
    main()
