"""Live-curve benchmark: the collector's ingest with the live what-if curves on, beside off,
in the same run, the curves' own rate, and their memory per instance.

Run: ``python benchmarks/live_curves.py --json`` (one JSON object; about a minute;
``--smoke``: tiny inputs, to check it runs).

The traffic is what kvtier's in-engine hooks ship: per request, one lookup event per prompt
block (16-token blocks, prefix-chained hashes, agentic sessions whose prompts grow turn by
turn over shared system prompts) and the request's record with its block hashes; batches of
``--batch-events`` block events, the instances' batches interleaved. Half the instances are
vLLM (its CPU tier simulated at each ladder size), half exclusive tiers (one stack).

* ``curve_events_per_s``: block events a second through ``LiveCurves.observe`` alone (the
  work the curves add to each stored batch), over all instances;
* ``ingest_events_per_s_curves_off`` / ``_on``: a ``CollectorService`` ingesting the
  batches into a file-backed store, its metrics and (``_on``) the curves, median of
  ``--rounds`` alternating rounds; ``ratio_on_vs_off`` their ratio. The batches reach the
  service as the hooks tap hands over what it finds queued on a busy socket: in its commit
  groups (``collector.taps.commit_groups``, one commit each);
  ``ingest_events_per_s_curves_off_commit_per_batch`` is the same with one commit per batch
  (the baseline the groups are measured against, in the same rounds).

Rates are per second of this process's CPU time (its threads together: DuckDB's too), so
that other work on a shared host does not count against them; ``*_wall`` are the same per
wall-clock second, and ``host_load`` the 1-minute load average when the run ended.
* ``memory_bytes_per_instance_vllm`` / ``_exclusive``: what one instance's curve holds (its
  kernel's tables and simulated tiers, its windows) at the default ladder (up to 4M tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from kvtier.collector.batch import EventBatch  # noqa: E402
from kvtier.collector.columns import columns_table, rows_to_table  # noqa: E402
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord, Tier  # noqa: E402
from kvtier.collector.service import CollectorConfig, CollectorService  # noqa: E402
from kvtier.collector.taps import commit_groups  # noqa: E402
from kvtier.policy.livecurve.config import CurveConfig  # noqa: E402
from kvtier.policy.livecurve.live_curves import LiveCurves  # noqa: E402

FIGURES = ("instances", "block_events", "requests", "batch_events", "curve_events_per_s",
           "curve_events_per_s_wall", "ingest_events_per_s_curves_off",
           "ingest_events_per_s_curves_on", "ratio_on_vs_off",
           "ingest_events_per_s_curves_off_commit_per_batch", "ingest_events_per_s_curves_off_wall",
           "ingest_events_per_s_curves_on_wall", "ratio_on_vs_off_wall",
           "memory_bytes_per_instance_vllm", "memory_bytes_per_instance_exclusive",
           "tracked_blocks_per_instance", "host_load")
SMOKE = {"events": 40_000, "instances": 2, "batch_events": 8192, "rounds": 1}
BLOCK = 16
MASK = (1 << 64) - 1


def sessions(seed: int, events: int, name: str) -> tuple[list[RequestRecord], list[np.ndarray]]:
    """One instance's requests (about ``events`` blocks in all) and each one's hashes."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 1 << 62, size=int(rng.integers(32, 96)), dtype=np.uint64)
               for _ in range(4)]
    records, chains, total, now, live = [], [], 0, 1.8e9, []
    while total < events:
        live = [c for c in live if len(c) < 400]
        if not live or rng.random() < 0.15:
            live.append(systems[int(rng.integers(0, 4))].copy())
        k = int(rng.integers(0, len(live)))
        live[k] = np.concatenate([live[k], rng.integers(0, 1 << 62, size=int(rng.integers(4, 40)),
                                                        dtype=np.uint64)])
        chain = _chained(live[k])
        now += float(rng.exponential(0.05))
        records.append(RequestRecord(f"{name}-{len(records)}", now, len(chain) * BLOCK - 5,
                                     block_hashes=tuple(int(h) for h in chain),
                                     block_size_tokens=BLOCK))
        chains.append(chain)
        total += len(chain)
    return records, chains


def _chained(contents: np.ndarray) -> np.ndarray:
    out = np.empty(len(contents), dtype=np.uint64)
    parent = 0
    for i, c in enumerate(contents.tolist()):
        parent = (parent * 0x9E3779B97F4A7C15 + c + 1) & MASK
        out[i] = parent
    return out


def batches(instances: int, events: int, batch_events: int) -> list[EventBatch]:
    """Hooks-like batches: each request's lookup events with its record."""
    per = []
    for i in range(instances):
        name = f"node-{i}"
        engine = "vllm" if i % 2 == 0 else "reference"
        records, chains = sessions(i, events // instances, name)
        origin = Origin(engine, name, f"vllm-hooks:{name}:1")
        out, start, size = [], 0, 0
        for end in range(1, len(records) + 1):
            size += len(chains[end - 1])
            if size >= batch_events or end == len(records):
                out.append(_batch(origin, len(out), records[start:end], chains[start:end]))
                start, size = end, 0
        per.append(out)
    return [b for group in zip(*per) for b in group] + [
        b for group in per for b in group[min(len(g) for g in per):]]


def _batch(origin: Origin, sequence: int, records, chains) -> EventBatch:
    lengths = np.array([len(c) for c in chains])
    hashes = np.concatenate(chains)
    positions = np.concatenate([np.arange(n) for n in lengths])
    owner = np.repeat(np.arange(len(records)), lengths)
    kinds = np.where(positions < lengths[owner] // 2, int(Outcome.GPU_HIT), int(Outcome.RECOMPUTE_MISS))
    events, _ = columns_table(BlockEvent, {
        "time_s": np.repeat([r.arrival_s for r in records], lengths), "kind": kinds,
        "block_hash": hashes, "request_id": np.array([r.request_id for r in records])[owner],
        "position": positions, "tokens": np.full(len(hashes), BLOCK),
        "size_bytes": np.full(len(hashes), BLOCK * 131072), "tier_to": np.full(len(hashes), int(Tier.GPU))})
    requests, _ = rows_to_table(RequestRecord, records)
    return EventBatch(origin, sequence, events, requests)


def curve_config() -> CurveConfig:
    return CurveConfig(gpu_tokens=65_536, ttft_budget_s=1.0)


def rates(stream: list[EventBatch], cpu_s: float, wall_s: float) -> tuple[float, float]:
    """Block events per CPU second and per wall second."""
    events = sum(b.block_events.num_rows for b in stream)
    return events / cpu_s, events / wall_s


def curves_alone(stream: list[EventBatch]) -> tuple[tuple[float, float], LiveCurves]:
    curves = LiveCurves(curve_config(), collector="bench")
    cpu, wall = time.process_time(), time.perf_counter()
    for batch in stream:
        curves.observe(batch)
    measured = rates(stream, time.process_time() - cpu, time.perf_counter() - wall)
    curves.flush()
    curves.refresh()
    return measured, curves


def ingest_rate(stream: list[EventBatch], folder: Path, curves_on: bool,
                grouped: bool = True) -> tuple[float, float]:
    observers = [LiveCurves(curve_config(), collector="bench")] if curves_on else []
    config = CollectorConfig(store_path=folder / f"store-{time.monotonic_ns()}.duckdb",
                             metrics_port=None, export_every_s=3600)
    service = CollectorService(config, observers=observers).start()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        if grouped:
            for group in commit_groups(stream):
                service.ingest_many(group)
        else:
            for batch in stream:
                service.ingest(batch)
        measured = rates(stream, time.process_time() - cpu, time.perf_counter() - wall)
    finally:
        service.stop()
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000, help="block events in all")
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--batch-events", type=int, default=32_768)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs, seconds: checks the "
                        "benchmark runs (its figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    stream = batches(args.instances, args.events, args.batch_events)
    (rate, rate_wall), curves = curves_alone(stream)
    found = curves.snapshot().instances
    figures = {"instances": args.instances,
               "block_events": sum(b.block_events.num_rows for b in stream),
               "requests": sum(b.requests.num_rows for b in stream),
               "batch_events": args.batch_events, "curve_events_per_s": rate,
               "curve_events_per_s_wall": rate_wall}
    for semantics in ("vllm", "exclusive"):
        sizes = [c.memory_bytes for c in found if c.semantics == semantics]
        figures[f"memory_bytes_per_instance_{semantics}"] = int(np.mean(sizes)) if sizes else 0
    figures["tracked_blocks_per_instance"] = int(np.mean([c.tracked_blocks for c in found]))
    off, on, per_batch = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):  # alternating, so the host's load falls on all alike
            off.append(ingest_rate(stream, Path(tmp), curves_on=False))
            on.append(ingest_rate(stream, Path(tmp), curves_on=True))
            per_batch.append(ingest_rate(stream, Path(tmp), curves_on=False, grouped=False))
    figures["ingest_events_per_s_curves_off_commit_per_batch"] = statistics.median(
        r[0] for r in per_batch)
    for clock, suffix in ((0, ""), (1, "_wall")):
        figures[f"ingest_events_per_s_curves_off{suffix}"] = statistics.median(r[clock] for r in off)
        figures[f"ingest_events_per_s_curves_on{suffix}"] = statistics.median(r[clock] for r in on)
        figures[f"ratio_on_vs_off{suffix}"] = (figures[f"ingest_events_per_s_curves_on{suffix}"]
                                               / figures[f"ingest_events_per_s_curves_off{suffix}"])
    figures["host_load"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))
    else:
        for key, value in figures.items():
            print(f"{key:38s} {value:,.3f}" if isinstance(value, float) else f"{key:38s} {value}")


if __name__ == "__main__":
    main()
