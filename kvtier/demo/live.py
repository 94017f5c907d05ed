"""The demo's live part: kvtier's reference engine, and rollouts of workloads through it.

The engine (a tiny transformer with a real paged KV cache: GPU pool, CPU tier, file tier) is
instrumented exactly as a real engine is: its recorder feeds the store through a flusher. The
load probe replays a workload once per rollout phase; its client-side request rows go to the
same store under their own origin (engine ``load-probe``), so the verbs can select them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin, RequestRecord
from kvtier.collector.store import TraceStore
from kvtier.demo.workloads import Workload

LOAD_PROBE = "load-probe"


@dataclass(frozen=True)
class Engine:
    """A running reference engine and what flushes its recorder into the store."""

    url: str
    flush: Callable[[], None]
    block_bytes: int


def engine_config(out_dir: Path, block_tokens: int, gpu_blocks: int):
    """The demo engine's configuration (GPU tier only; the rollout switches tiers)."""
    from kvtier.refengine.config import EngineConfig, TierConfig

    return EngineConfig(block_size_tokens=block_tokens, tiers=TierConfig(gpu_blocks=gpu_blocks),
                        file_dir=str(out_dir / "file-tier"))


@contextlib.contextmanager
def engine(store: TraceStore, out_dir: Path, block_tokens: int, gpu_blocks: int) -> Iterator[Engine]:
    """Start the engine (GPU tier only), flush into ``store`` while it runs, stop it."""
    from kvtier.collector.flusher import Flusher
    from kvtier.collector.recorder import Recorder
    from kvtier.refengine.server import EngineServer, ServerSettings

    # One source per run: the store's ledger must not mistake this run's batches for an earlier run's.
    recorder = Recorder(Origin("reference", "demo-engine", f"demo-engine/{time.time_ns()}"),
                        capacity_events=1 << 22)
    config = engine_config(out_dir, block_tokens, gpu_blocks)
    server = EngineServer(config, ServerSettings(port=0, instance="demo-engine"),
                          recorder=recorder).start()
    try:
        # Flushed between phases (run_act's after_phase), not under load: the store shares
        # this process with the engine, and a flush every 0.5 s took the engine thread's
        # interpreter often enough to slow its steps 1.65x in the CPU-tier phase (decode steps
        # of the same width and context: 2.6 ms against 1.5 ms), a slowdown no deployment
        # with its collector in another process would see. A phase's events fit the
        # recorder's buffer (drops would be counted); the hourly flush only bounds it.
        with Flusher(recorder, store, interval_s=3600.0) as flusher:
            yield Engine(server.url, flusher.flush, config.block_bytes)
    finally:
        server.stop()


def run_act(running: Engine, workload: Workload, records: Sequence[RequestRecord], plan,
            store: TraceStore, progress: Callable[[str], None]):
    """The rollout of ``workload`` under ``plan``; every phase's rows land in ``store``."""
    from kvtier.rollout.drive import phase_driver
    from kvtier.rollout.runner import EngineAdminSwitcher, run_rollout
    from kvtier.probes.active.load import LoadConfig

    load = LoadConfig(concurrency=workload.concurrency, requests_per_level=workload.requests_per_level,
                      max_tokens=workload.max_tokens, block_tokens=workload.block_tokens,
                      max_blocks=workload.max_blocks)
    run_phase = phase_driver(running.url, records, load, progress=progress,
                             on_result=lambda tiers, result: _store_load(store, result))
    return run_rollout(plan, EngineAdminSwitcher(running.url), run_phase,
                       block_tokens=workload.block_tokens, progress=progress,
                       after_phase=lambda tiers: running.flush())


def _store_load(store: TraceStore, result) -> None:
    origin = Origin(LOAD_PROBE, "demo-engine", f"{LOAD_PROBE}/{result.run_id}")
    store.ingest(EventBatch.from_rows(origin, 0, requests=result.records))


def measured_costs(store: TraceStore, tier_config_ids: Sequence[str]) -> dict[str, float]:
    """Median microseconds per token of each lookup outcome, from the engine's own events in
    the given phases."""
    marks = ", ".join("?" for _ in tier_config_ids)
    rows = store.query(f"""
        SELECT CAST(e.kind AS VARCHAR) AS kind, median(e.latency_s * 1e6 / e.tokens) AS us_per_token
        FROM block_events_with_origin e
        JOIN (SELECT DISTINCT source, request_id FROM requests_with_origin
              WHERE engine = 'reference' AND tier_config_id IN ({marks})) r
          ON r.source = e.source AND r.request_id = e.request_id
        WHERE e.engine = 'reference' AND e.latency_s IS NOT NULL AND e.tokens > 0
          AND CAST(e.kind AS VARCHAR) IN ('cpu_promotion', 'cold_promotion', 'recompute_miss')
        GROUP BY ALL""", list(tier_config_ids)).to_pylist()
    return {row["kind"]: row["us_per_token"] for row in rows}
