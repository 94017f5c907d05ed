"""The demo: the main job on embedded defaults, end to end on a bundled real trace.

Today it runs the collector path for real: the trace's requests go through a ``Recorder``
and ``Flusher`` into a DuckDB store, out again as Parquet segments, and back through the
segment reader; every figure it prints is counted from the store. The reference engine,
the tiered replay and the recommendation join as their issues land (#3, #5, #6).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Callable

from collector.events import Origin

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
    from collector.flusher import Flusher
    from collector.reader import SegmentReader
    from collector.recorder import Recorder
    from collector.segments import export_segments
    from collector.store import TraceStore
    from kvtier.progress import track
    from policy.readers import open_trace

    trace_path = config.trace or bundled_trace()
    reader = open_trace(trace_path)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    store_path = config.out_dir / "kvtier.duckdb"
    segments = config.out_dir / "segments"
    _clear_previous_run(store_path, segments, say)
    started_s = clock()
    origin = Origin("trace-replay", "demo", f"demo:{trace_path.name}:{started_s:.6f}")
    say(f"kvtier demo: trace {trace_path} ({getattr(reader, 'format_name', 'trace')})")

    with TraceStore(store_path, clock=clock) as store:
        recorder = Recorder(origin, clock=clock)
        t0 = time.perf_counter()
        with Flusher(recorder, store, interval_s=0.2) as flusher:
            requests = list(_limited(reader.requests(), config.max_requests))
            # The trace is laid on the wall clock so that it ends when the demo starts.
            shift_s = started_s - max((r.arrival_s for r in requests), default=0.0)
            for record in track(requests, "recording requests"):
                recorder.record_request(replace(record, arrival_s=record.arrival_s + shift_s,
                                                tier_config_id="trace"))
        ingest_s = time.perf_counter() - t0
        figures = _store_figures(store)
        figures.update(ingest_s=ingest_s, batches=flusher.batches_stored,
                       dropped=recorder.dropped_requests)
        exported = export_segments(store, segments)
    read_back = sum(1 for _ in SegmentReader(segments).requests())
    figures.update(store=str(store_path), segments=str(segments), segment_files=len(exported.files),
                   read_back_requests=read_back)
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
    row = store.query("""
        WITH refs AS (SELECT unnest(block_hashes) AS h FROM requests),
             uses AS (SELECT h, count(*) AS n FROM refs GROUP BY h)
        SELECT (SELECT count(*) FROM requests) AS requests,
               (SELECT sum(prompt_tokens) FROM requests) AS prompt_tokens,
               (SELECT sum(output_tokens) FROM requests) AS output_tokens,
               (SELECT count(*) FROM refs) AS block_references,
               (SELECT count(*) FROM uses) AS distinct_blocks,
               (SELECT count(*) FROM uses WHERE n = 1) AS blocks_used_once,
               (SELECT max(arrival_s) - min(arrival_s) FROM requests) AS span_s
    """).to_pylist()[0]
    return row


def _report(f: dict, say) -> None:
    once = f["blocks_used_once"] / f["distinct_blocks"] if f["distinct_blocks"] else 0.0
    say(f"  recorded {f['requests']:,} requests over {f['span_s'] / 60:.1f} min of trace time "
        f"({f['prompt_tokens']:,} prompt tokens, {f['output_tokens']:,} output tokens) "
        f"into {f['store']} in {f['batches']} batch(es), {f['ingest_s']:.2f} s, {f['dropped']} dropped")
    say(f"  {f['block_references']:,} block references to {f['distinct_blocks']:,} distinct prefix blocks; "
        f"{once:.1%} of the blocks are referenced once (never reused)")
    say(f"  exported {f['segment_files']} Parquet segment file(s) to {f['segments']}; "
        f"read back {f['read_back_requests']:,} requests from them without touching the store's lock")
    say("  not yet in the demo: the reference engine and the GPU-only -> +CPU -> +file rollout (#6), "
        "the tiered what-if replay (#3), the admission model and engine configs (#5), the dashboard (#7)")
