"""The demo's live part: the reference engine, the rollout through its phases, measured costs.

A documented, scaled-down slice of the trace (``DemoSlice``) is replayed through kvtier's
reference engine (a tiny transformer with a real paged KV cache: GPU pool, CPU tier, file
tier) by the load probe, once per rollout phase. The engine is instrumented exactly as a
real engine is: its recorder feeds the store through a flusher; the load probe's client-side
request rows go to the same store under their own origin.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from collector.batch import EventBatch
from collector.events import Origin, RequestRecord
from collector.store import TraceStore


@dataclass(frozen=True, slots=True)
class DemoSlice:
    """The trace slice and load shape the demo replays (small enough for two CPU cores).

    The first ``requests`` requests of the trace; each prompt keeps its first ``max_blocks``
    trace blocks, one engine block of ``block_tokens`` tokens per trace block, so prefix
    sharing is exactly the trace's; ``max_tokens`` output tokens; the ramp is ``concurrency``.
    """

    requests: int = 600
    max_blocks: int = 32
    block_tokens: int = 16
    max_tokens: int = 8
    concurrency: tuple[int, ...] = (1, 2, 4)
    gpu_blocks: int = 48
    cpu_blocks: int = 1024
    cold_blocks: int = 8192

    def __post_init__(self) -> None:
        if self.requests < len(self.concurrency):
            raise ValueError(f"requests must be >= one per concurrency level, got {self.requests}")


@dataclass(frozen=True)
class LiveResult:
    report: object  # kvtier.rollout.runner.RolloutReport
    costs_us_per_token: dict[str, float]


def run_live(trace: Sequence[RequestRecord], store: TraceStore, out_dir: Path, shape: DemoSlice,
             progress: Callable[[str], None]) -> LiveResult:
    """Start the engine, run the rollout against it, stop it; everything lands in ``store``."""
    from policy.rollback.rule import LatencyBudget
    from collector.flusher import Flusher
    from collector.recorder import Recorder
    from kvtier.rollout.drive import phase_driver
    from kvtier.rollout.plan import RolloutPlan
    from kvtier.rollout.runner import EngineAdminSwitcher, run_rollout
    from probes.active.load import LoadConfig
    from refengine.config import EngineConfig, TierConfig
    from refengine.server import EngineServer, ServerSettings

    # One source per run: the store's ledger must not mistake this run's batches for an earlier run's.
    recorder = Recorder(Origin("reference", "demo-engine", f"demo-engine/{time.time_ns()}"), capacity_events=1 << 22)
    config = EngineConfig(block_size_tokens=shape.block_tokens, tiers=TierConfig(gpu_blocks=shape.gpu_blocks),
                          file_dir=str(out_dir / "file-tier"))
    # Budgets scaled to a demo's seconds-long phases (production defaults are minutes).
    plan = RolloutPlan(shape.gpu_blocks, shape.cpu_blocks, shape.cold_blocks,
                       budget=LatencyBudget(ttft_p99_s=2.0, itl_p99_s=0.5, sustained_s=10, window_s=10))
    load = LoadConfig(concurrency=shape.concurrency, requests_per_level=shape.requests // len(shape.concurrency),
                      max_tokens=shape.max_tokens, block_tokens=shape.block_tokens, max_blocks=shape.max_blocks)
    server = EngineServer(config, ServerSettings(port=0, instance="demo-engine"), recorder=recorder).start()
    try:
        with Flusher(recorder, store, interval_s=0.5) as flusher:
            run_phase = phase_driver(server.url, trace, load, progress=progress,
                                     on_result=lambda tiers, result: _store_load(store, tiers, result))
            report = run_rollout(plan, EngineAdminSwitcher(server.url), run_phase,
                                 block_tokens=shape.block_tokens, progress=progress,
                                 after_phase=lambda tiers: flusher.flush())
    finally:
        server.stop()
    return LiveResult(report, measured_costs(store))


def _store_load(store: TraceStore, tiers, result) -> None:
    origin = Origin("load-probe", "demo-engine", f"load-probe/{result.run_id}")
    store.ingest(EventBatch.from_rows(origin, 0, requests=result.records))


def measured_costs(store: TraceStore) -> dict[str, float]:
    """Median microseconds per token of each lookup outcome, from the engine's own events."""
    rows = store.query("""
        SELECT CAST(kind AS VARCHAR) AS kind, median(latency_s * 1e6 / tokens) AS us_per_token
        FROM block_events_with_origin
        WHERE engine = 'reference' AND latency_s IS NOT NULL AND tokens > 0
          AND CAST(kind AS VARCHAR) IN ('cpu_promotion', 'cold_promotion', 'recompute_miss', 'gpu_hit')
        GROUP BY ALL""").to_pylist()
    return {row["kind"]: row["us_per_token"] for row in rows}
