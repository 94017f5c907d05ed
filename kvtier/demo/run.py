"""The demo: the main job on embedded defaults, end to end on a bundled real trace.

A scaled-down slice of the Mooncake conversation trace (``DemoSlice``) is replayed by the
load probe through kvtier's reference engine in each rollout phase (GPU-only, +CPU tier,
+file tier if justified); the engine's hooks and the probe's rows go into a DuckDB store,
out as Parquet segments for the dashboard. Every latency it prints is measured. Then the
host's memory headroom and file-tier speed are probed, and the analysis and recommendation run
over the whole trace with them: the CPU size is capped at this host's memory, and the file
tier is priced with this disk.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvtier.demo.live import DemoSlice
from kvtier.traces import bundled_trace


@dataclass(frozen=True, slots=True)
class DemoConfig:
    out_dir: Path
    trace: Path | None = None  # None: the bundled Mooncake conversation trace
    shape: DemoSlice = DemoSlice()
    recommend: bool = True  # run the analysis and the recommendation after the rollout


def run_demo(config: DemoConfig, *, clock: Callable[[], float] = time.time, say=print) -> dict:
    """Run the demo and return its figures (also printed through ``say``)."""
    from collector.segments import export_segments
    from collector.store import TraceStore
    from kvtier.demo.live import run_live
    from kvtier.progress import progress_lines
    from policy.readers import open_trace

    trace_path = config.trace or bundled_trace()
    reader = open_trace(trace_path)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    store_path = config.out_dir / "kvtier.duckdb"
    segments = config.out_dir / "segments"
    _clear_previous_run(store_path, segments, say)
    say(f"kvtier demo: trace {trace_path} ({getattr(reader, 'format_name', 'trace')})")

    requests = list(itertools.islice(reader.requests(), config.shape.requests))
    if not requests:
        raise ValueError(f"{trace_path} holds no requests")
    say(f"  slice: the first {len(requests)} requests, prompts cut to {config.shape.max_blocks} blocks of "
        f"{config.shape.block_tokens} tokens, {config.shape.max_tokens} output tokens, concurrency ramp "
        f"{'/'.join(map(str, config.shape.concurrency))}")
    with TraceStore(store_path, clock=clock) as store:
        t0 = time.perf_counter()
        with progress_lines(say) as progress:
            live = run_live(requests, store, config.out_dir, config.shape, progress)
        live_s = time.perf_counter() - t0
        figures = _store_figures(store)
        exported = export_segments(store, segments)
    figures.update(store=str(store_path), segments=str(segments), segment_files=len(exported.files),
                   live_s=live_s, costs=live.costs_us_per_token, report=live.report)
    _report(figures, say)
    if not config.recommend:
        say(f"  open the dashboard: kvtier dashboard --segments {segments}")
        return figures
    say("  analysis and recommendation over the whole trace (simulated replay; host headroom "
        "and file-tier speed measured on this host):")
    probes = _measure_host(config.out_dir / "probes", say)
    _run_verb("analyze", ["--trace", str(trace_path), "--out", str(config.out_dir / "analysis")], say)
    _run_verb("recommend", ["--trace", str(trace_path), "--engine", "all",
                            "--headroom-json", str(probes["headroom"]),
                            "--fs-json", str(probes["fs"]),
                            "--cold-path", str((config.out_dir / "file-tier").resolve()),
                            "--out", str(config.out_dir / "recommendation")], say)
    say(f"  open the dashboard: kvtier dashboard --segments {segments} "
        f"--recommendation {config.out_dir / 'recommendation'}")
    return figures


def _measure_host(folder: Path, say) -> dict[str, Path]:
    """Run the headroom and file-tier probes (about two seconds) so the recommendation's CPU
    size is capped at this host's memory and its file-tier verdict uses this disk's speed."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fs").mkdir(exist_ok=True)
    paths = {"headroom": folder / "headroom.json", "fs": folder / "fs.json"}
    _run_verb("probe", ["headroom", "--json", "--out", str(paths["headroom"])], say, quiet=True)
    _run_verb("probe", ["fs", "--json", "--dir", str(folder / "fs"), "--out", str(paths["fs"])],
              say, quiet=True)
    headroom = json.loads(paths["headroom"].read_text())
    reads = [r for r in json.loads(paths["fs"].read_text())["rows"] if r["op"] == "read"]
    best = max(reads, key=lambda r: r["throughput_bytes_per_s"])
    say(f"    host headroom {headroom['safe_bytes'] / 2**30:.1f} GiB safe for a CPU tier "
        f"(limited by {headroom['limited_by']}); file reads up to "
        f"{best['throughput_bytes_per_s'] / 1e6:,.0f} MB/s ({best['size_bytes'] // 1024} KiB blocks, "
        f"{best['threads']} threads) in {folder / 'fs'}")
    return paths


def _run_verb(verb: str, argv: list[str], say, *, quiet: bool = False) -> None:
    """Run another verb exactly as its command line would, its output indented."""
    import argparse
    import contextlib
    import importlib
    import io

    module = importlib.import_module(f"kvtier.verbs.{verb}")
    parser = argparse.ArgumentParser(prog=f"kvtier {verb}")
    module.add_arguments(parser)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        module.run(parser.parse_args(argv))
    lines = output.getvalue().splitlines()
    say(f"  kvtier {verb} {' '.join(argv)}")
    if quiet:
        return
    for line in (lines if verb == "recommend" else [line for line in lines if "verdict" in line.lower()]):
        say(f"    {line}")


def _clear_previous_run(store_path: Path, segments: Path, say) -> None:
    """A demo run starts from an empty store so its figures describe this run alone."""
    import shutil

    if store_path.exists():
        _check_replaceable(store_path)
    if store_path.exists() or segments.exists():
        say(f"  replacing the previous demo run's store and segments in {store_path.parent}")
    for path in (store_path, store_path.with_name(store_path.name + ".wal")):
        path.unlink(missing_ok=True)
    shutil.rmtree(segments, ignore_errors=True)


def _check_replaceable(store_path: Path) -> None:
    """The demo replaces its own previous store, never someone else's file: raise unless
    ``store_path`` is a kvtier store (of any schema) that no process holds."""
    from collector.storefile import NotAStoreError, StoreSchemaError, connect

    try:
        connect(store_path, read_only=True).close()
    except StoreSchemaError:
        pass  # an older kvtier's store: still the demo's own kind of file
    except NotAStoreError:
        raise ValueError(f"--out {store_path.parent}: {store_path.name} there is not a kvtier "
                         "store, and the demo would replace it; choose another --out") from None


def _store_figures(store) -> dict:
    return store.query("""
        SELECT (SELECT count(*) FROM requests) AS requests,
               (SELECT count(*) FROM block_events) AS block_events,
               (SELECT count(*) FROM ingested_batches) AS batches,
               (SELECT coalesce(sum(rejected), 0) FROM ingested_batches) AS rejected
    """).to_pylist()[0]


def _report(f: dict, say) -> None:
    from kvtier.rollout.from_args import render_table

    say(f"  rollout against the reference engine in {f['live_s']:.0f} s (measured, client side):")
    for line in render_table(f["report"]).splitlines():
        say("    " + line)
    costs = f["costs"]
    if "cpu_promotion" in costs and "recompute_miss" in costs:
        say(f"  measured cost per token: CPU promotion {costs['cpu_promotion']:.2f} us, cold promotion "
            f"{costs.get('cold_promotion', float('nan')):.2f} us, recompute {costs['recompute_miss']:.2f} us "
            f"(median over the engine's block events)")
    say(f"  stored {f['block_events']:,} block events and {f['requests']:,} request records in {f['batches']} "
        f"batches ({f['rejected']} rejected) in {f['store']}")
    say(f"  exported {f['segment_files']} Parquet segment file(s) to {f['segments']}")
