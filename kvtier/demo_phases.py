"""The demo's rollout phases, replayed through the tiered simulator into the store.

GPU-only, then a CPU tier, then a file tier behind it (vLLM's offloading semantics). Each
phase replays the same trace; the simulator's per-block outcomes and each request's tokens
per tier go through a ``Recorder`` exactly as a live engine's would, under the origin engine
``"simulator"`` so simulated rows are never mistaken for measured ones. Phases are laid one
after another on the clock, ending when the demo starts, like a rollout's epochs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from collector.events import BlockEvent, Origin, RequestRecord
from collector.flusher import Flusher
from collector.recorder import Recorder
from collector.store import TraceStore

SIMULATOR_ENGINE = "simulator"


@dataclass(frozen=True, slots=True)
class Phase:
    """One tier configuration of the rollout, capacities in tokens (0: no such tier)."""

    name: str
    gpu_tokens: int
    cpu_tokens: int = 0
    cold_tokens: int = 0


DEFAULT_PHASES = (
    Phase("gpu-only", gpu_tokens=1_000_000),
    Phase("gpu+cpu", gpu_tokens=1_000_000, cpu_tokens=8_000_000),
    Phase("gpu+cpu+file", gpu_tokens=1_000_000, cpu_tokens=8_000_000, cold_tokens=40_000_000),
)


@dataclass(frozen=True, slots=True)
class PhaseResult:
    phase: Phase
    totals: dict
    promotion_cost_s: float
    recompute_same_tokens_s: float


def replay_phases(records: Sequence[RequestRecord], store: TraceStore, *, started_s: float,
                  phases: Sequence[Phase] = DEFAULT_PHASES, progress: Callable = lambda it, _: it
                  ) -> list[PhaseResult]:
    """Replay ``records`` once per phase into ``store``; returns each phase's totals."""
    from policy.cost import CostParams
    from policy.sim.config import SimConfig, blocks_from_tokens
    from policy.sim.simulator import Simulator

    params = CostParams()
    first = min(r.arrival_s for r in records)
    span_s = max(r.arrival_s for r in records) - first + 1.0
    block_tokens = records[0].block_size_tokens or 16
    results = []
    for index, phase in enumerate(phases):
        shift_s = started_s - (len(phases) - index) * span_s - first
        origin = Origin(SIMULATOR_ENGINE, "demo", f"demo:{phase.name}:{started_s:.6f}")
        recorder = Recorder(origin, capacity_events=1 << 22)
        config = SimConfig(gpu_blocks=blocks_from_tokens(phase.gpu_tokens, block_tokens),
                           cpu_blocks=blocks_from_tokens(phase.cpu_tokens, block_tokens),
                           cold_blocks=blocks_from_tokens(phase.cold_tokens, block_tokens),
                           semantics="vllm", policy="lru", default_block_tokens=block_tokens)
        shifted = [replace(r, arrival_s=r.arrival_s + shift_s) for r in records]
        sim = Simulator(config, events=_recording(recorder))
        with Flusher(recorder, store, interval_s=0.2):
            totals = sim.replay(progress(shifted, f"phase {phase.name}"),
                                on_request=_request_recording(recorder, phase.name))
        moved = params.promotion_s(totals.cpu_promotion_tokens, "cpu") + params.promotion_s(
            totals.cold_promotion_tokens, "cold")
        recompute = params.recompute_s(totals.cpu_promotion_tokens + totals.cold_promotion_tokens)
        results.append(PhaseResult(phase, totals.to_dict(), moved, recompute))
    return results


def _request_recording(recorder: Recorder, tier_config_id: str) -> Callable:
    def on_request(record: RequestRecord, outcome) -> None:
        recorder.record_request(outcome.apply_to(record, tier_config_id=tier_config_id))
    return on_request


def _recording(recorder: Recorder) -> Callable[[BlockEvent], None]:
    record = recorder.record

    def on_event(e: BlockEvent) -> None:
        record(e.kind, e.block_hash, e.request_id, e.parent_hash, e.position, e.tokens, e.size_bytes,
               e.tier_from, e.tier_to, e.priority, e.latency_s, e.time_s)
    return on_event
