"""The demo: the main job on embedded defaults, end to end on a bundled real trace.

Today it runs the collector path for real: the trace's requests go through a ``Recorder``
and ``Flusher`` into a DuckDB store, out again as Parquet segments, and back through the
segment reader; every figure it prints is counted from the store. The reference engine,
the tiered replay and the recommendation join as their issues land (#3, #5, #6).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

BUNDLED_TRACE = "mooncake_conversation_trace.jsonl.gz"


@dataclass(frozen=True, slots=True)
class DemoConfig:
    out_dir: Path
    trace: Path | None = None  # None: the bundled Mooncake conversation trace
    max_requests: int | None = None

    def __post_init__(self) -> None:
        if self.max_requests is not None and self.max_requests <= 0:
            raise ValueError(f"max_requests must be > 0, got {self.max_requests}")


def bundled_trace() -> Path:
    return Path(str(resources.files("kvtier") / "data" / BUNDLED_TRACE))


def run_demo(config: DemoConfig, *, clock: Callable[[], float] = time.time, say=print) -> dict:
    """Run the demo and return its figures (also printed through ``say``)."""
    from collector.reader import SegmentReader
    from collector.segments import export_segments
    from collector.store import TraceStore
    from kvtier.progress import track
    from kvtier.demo_phases import replay_phases
    from policy.readers import open_trace

    trace_path = config.trace or bundled_trace()
    reader = open_trace(trace_path)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    store_path = config.out_dir / "kvtier.duckdb"
    segments = config.out_dir / "segments"
    _clear_previous_run(store_path, segments, say)
    started_s = clock()
    say(f"kvtier demo: trace {trace_path} ({getattr(reader, 'format_name', 'trace')})")

    requests = list(_limited(reader.requests(), config.max_requests))
    if not requests:
        raise ValueError(f"{trace_path} holds no requests")
    with TraceStore(store_path, clock=clock) as store:
        t0 = time.perf_counter()
        phases = replay_phases(requests, store, started_s=started_s,
                               progress=lambda items, label: track(items, label, total=len(requests)))
        replay_s = time.perf_counter() - t0
        figures = _store_figures(store)
        exported = export_segments(store, segments)
    read_back = sum(1 for _ in SegmentReader(segments).requests())
    figures.update(store=str(store_path), segments=str(segments), segment_files=len(exported.files),
                   read_back_requests=read_back, replay_s=replay_s, trace_requests=len(requests),
                   phases=[_phase_row(p) for p in phases])
    _report(figures, say)
    return figures


def _clear_previous_run(store_path: Path, segments: Path, say) -> None:
    """A demo run starts from an empty store so its figures describe this run alone."""
    import shutil

    if store_path.exists() or segments.exists():
        say(f"  replacing the previous demo run's store and segments in {store_path.parent}")
    for path in (store_path, store_path.with_name(store_path.name + ".wal")):
        path.unlink(missing_ok=True)
    shutil.rmtree(segments, ignore_errors=True)


def _limited(records, limit):
    for i, record in enumerate(records):
        if limit is not None and i >= limit:
            return
        yield record


def _store_figures(store) -> dict:
    return store.query("""
        SELECT (SELECT count(*) FROM requests) AS requests,
               (SELECT count(*) FROM block_events) AS block_events,
               (SELECT count(*) FROM ingested_batches) AS batches,
               (SELECT coalesce(sum(rejected), 0) FROM ingested_batches) AS rejected
    """).to_pylist()[0]


def _phase_row(result) -> dict:
    t = result.totals
    prompt = t["prompt_tokens"] or 1
    return {"phase": result.phase.name, "requests": t["requests"],
            "gpu_hit": t["gpu_hit_tokens"] / prompt, "cpu_promotion": t["cpu_promotion_tokens"] / prompt,
            "cold_promotion": t["cold_promotion_tokens"] / prompt, "recompute": t["recompute_tokens"] / prompt,
            "promotion_transfer_s": result.promotion_cost_s, "recompute_same_tokens_s": result.recompute_same_tokens_s}


def _report(f: dict, say) -> None:
    say(f"  replayed {f['trace_requests']:,} requests through {len(f['phases'])} tier configurations "
        f"in {f['replay_s']:.1f} s (simulated, vLLM semantics, LRU)")
    say(f"  {'phase':14s} {'GPU hit':>8s} {'CPU prom.':>10s} {'cold prom.':>10s} {'recompute':>10s} "
        f"{'transfer s':>11s} {'recompute s':>12s}")
    for row in f["phases"]:
        say(f"  {row['phase']:14s} {row['gpu_hit']:8.1%} {row['cpu_promotion']:10.1%} {row['cold_promotion']:10.1%} "
            f"{row['recompute']:10.1%} {row['promotion_transfer_s']:11.1f} {row['recompute_same_tokens_s']:12.1f}")
    say("  (shares of prompt tokens; 'transfer s' is the promotions' copy time and 'recompute s' the prefill "
        "the same tokens would have cost, both from the cost model's documented defaults, not measured)")
    say(f"  stored {f['block_events']:,} block events and {f['requests']:,} request records in {f['batches']} "
        f"batches ({f['rejected']} rejected) in {f['store']}")
    say(f"  exported {f['segment_files']} Parquet segment file(s) to {f['segments']}; read back "
        f"{f['read_back_requests']:,} requests from them without touching the store's lock")
    say(f"  open the dashboard: kvtier dashboard --segments {f['segments']}")
    say("  not yet in the demo: the reference engine with measured latencies and the live rollout (#6), "
        "the admission model and engine configs (#5)")
