"""Realistic segment folders for dashboard tests, built through the real recorder, store
and exporter: a three-phase rollout (GPU only -> +CPU -> +cold) on two instances with shared
prefixes, every block-event kind with latencies, and requests with TTFT/ITL."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import (BlockEvent, MetricInterval, Origin, Outcome, RequestRecord,
                                     Tier)
from kvtier.collector.recorder import Recorder
from kvtier.collector.segments import export_segments
from kvtier.collector.store import TraceStore

T0_S = 1_800_000_000.0
BLOCK_TOKENS = 16
BLOCK_BYTES = 2 * 1024 * 1024
PHASES = ("gpu-only", "gpu+cpu", "gpu+cpu+cold")


@dataclass(frozen=True)
class Scenario:
    """What to generate. ``requests_per_phase`` lists one count per entry in ``phases``."""

    phases: tuple[str, ...] = PHASES
    requests_per_phase: tuple[int, ...] = (60, 60, 60)
    instances: tuple[str, ...] = ("node-a", "node-b")
    engine: str = "vllm"
    block_events: bool = True
    with_latency: bool = True
    seed: int = 7


MID_ROLLOUT = Scenario(requests_per_phase=(80, 80, 6))
SIMULATED = Scenario(engine="trace-replay", block_events=False, with_latency=False,
                     phases=("trace",), requests_per_phase=(90,))


def build_segments(root: Path, scenario: Scenario = Scenario()) -> Path:
    """Write ``scenario`` as segments under ``root`` and return ``root``."""
    rng = np.random.default_rng(scenario.seed)
    with TraceStore(":memory:", clock=lambda: T0_S) as store:
        for index, instance in enumerate(scenario.instances):
            recorder = Recorder(Origin(scenario.engine, instance, f"{instance}/test"), clock=lambda: T0_S)
            _record_instance(recorder, scenario, rng, instance, index)
            store.ingest(recorder.take_events())
        export_segments(store, root)
    return root


def _record_instance(recorder: Recorder, scenario: Scenario, rng, instance: str, index: int) -> None:
    now_s = T0_S + index * 0.5
    block_bytes = BLOCK_BYTES >> index  # instances serve models with different block sizes
    prefixes = [tuple(int(h) for h in rng.integers(1, 2**62, size=8)) for _ in range(5)]
    for phase_index, (phase, count) in enumerate(zip(scenario.phases, scenario.requests_per_phase)):
        for n in range(count):
            now_s += float(rng.exponential(2.0))
            request_id = f"{instance}-{phase}-{n}"
            hashes = prefixes[int(rng.integers(len(prefixes)))][: int(rng.integers(2, 9))]
            hashes += tuple(int(h) for h in rng.integers(1, 2**62, size=int(rng.integers(1, 4))))
            tokens = _record_blocks(recorder, scenario, rng, request_id, hashes, now_s, phase_index, block_bytes)
            recorder.record_request(_request(scenario, rng, request_id, now_s, hashes, tokens, phase))


def _outcome(rng, phase_index: int, position: int) -> Outcome:
    if position >= 8:
        return Outcome.RECOMPUTE_MISS
    choices = [Outcome.GPU_HIT, Outcome.RECOMPUTE_MISS, Outcome.CPU_PROMOTION, Outcome.COLD_PROMOTION]
    return choices[int(rng.integers(0, min(2 + phase_index, len(choices))))]


_SOURCE = {Outcome.CPU_PROMOTION: Tier.CPU, Outcome.COLD_PROMOTION: Tier.COLD}
_LATENCY_S = {Outcome.GPU_HIT: 0.0, Outcome.CPU_PROMOTION: 0.002, Outcome.COLD_PROMOTION: 0.02,
              Outcome.RECOMPUTE_MISS: 0.01}


def _record_blocks(recorder, scenario, rng, request_id, hashes, now_s, phase_index, block_bytes) -> dict:
    tokens = dict.fromkeys(Outcome, 0)
    parent = None
    for position, block_hash in enumerate(hashes):
        kind = _outcome(rng, phase_index, position)
        tokens[kind] += BLOCK_TOKENS
        if scenario.block_events:
            scale = block_bytes / BLOCK_BYTES if kind in _SOURCE else 1.0
            latency = _LATENCY_S[kind] * scale * float(rng.lognormal(0.0, 0.5)) if scenario.with_latency else None
            recorder.record(kind, block_hash, request_id=request_id, parent_hash=parent, position=position,
                            tokens=BLOCK_TOKENS, size_bytes=block_bytes, tier_from=_SOURCE.get(kind),
                            tier_to=Tier.GPU, latency_s=latency, time_s=now_s + position * 1e-4)
            if phase_index > 0 and kind == Outcome.RECOMPUTE_MISS:
                recorder.record(Outcome.STORE, block_hash, request_id=request_id, size_bytes=block_bytes,
                                tier_from=Tier.GPU, tier_to=Tier.CPU, latency_s=0.001, time_s=now_s + 0.05)
        parent = block_hash
    if scenario.block_events and phase_index > 0:
        recorder.record(Outcome.EVICT, hashes[-1], tier_from=Tier.CPU, time_s=now_s + 0.1)
        recorder.record(Outcome.DROP, hashes[-1] ^ 1, tier_from=Tier.GPU, time_s=now_s + 0.1)
        recorder.record(Outcome.PRIORITY_UPDATE, hashes[0], priority=50, time_s=now_s + 0.1)
    return tokens


def _request(scenario, rng, request_id, now_s, hashes, tokens, phase) -> RequestRecord:
    latency = scenario.with_latency
    recomputed = tokens[Outcome.RECOMPUTE_MISS]
    return RequestRecord(
        request_id, now_s, prompt_tokens=len(hashes) * BLOCK_TOKENS, output_tokens=int(rng.integers(8, 64)),
        block_hashes=tuple(hashes), block_size_tokens=BLOCK_TOKENS,
        gpu_hit_tokens=tokens[Outcome.GPU_HIT], cpu_promotion_tokens=tokens[Outcome.CPU_PROMOTION],
        cold_promotion_tokens=tokens[Outcome.COLD_PROMOTION], recomputed_tokens=recomputed,
        ttft_s=(0.05 + recomputed * 1e-4 * float(rng.lognormal(0, 0.3))) if latency else None,
        itl_s=0.02 * float(rng.lognormal(0, 0.2)) if latency else None,
        e2e_latency_s=0.5 if latency else None, tier_config_id=phase)


def write_recommendation(folder: Path, ttft_p99_budget_s: float | None = 2.0,
                         baseline: str | None = None) -> Path:
    """A recommendation folder as ``kvtier recommend`` writes it (report.write of a real
    recommendation of a synthetic multi-turn trace, every engine's config), with the rollback
    rule's TTFT budget set to ``ttft_p99_budget_s`` (``None``: no rule), computed from the
    ``baseline`` tier configuration's requests (``None``: not recorded)."""
    import dataclasses

    from kvtier.policy.recommend import report
    from kvtier.policy.recommend.values import RollbackRule
    from kvtier.policy.writers import ENGINES

    rec = _recommendation()
    rule = None if ttft_p99_budget_s is None else RollbackRule(ttft_p99_budget_s, 300, 120, 1.0, baseline)
    rec = dataclasses.replace(rec, evidence=dataclasses.replace(rec.evidence, rollback=rule))
    report.write(rec, folder, ENGINES)
    return folder


_CACHE: dict = {}


def _recommendation():
    """One real recommendation per test process (it takes a few seconds)."""
    if "rec" not in _CACHE:
        from kvtier.policy.cost import CostParams, Param
        from kvtier.policy.recommend.build import Inputs, recommend
        from tests.policy.learn.synthetic import conversations

        # priced as kvtier calibrate would have fitted them: the queue model may promise TTFT
        calibrated = CostParams(prefill_tokens_per_s=Param(8000.0, "calibrated"),
                                cpu_gpu_bandwidth_bytes_per_s=Param(20e9, "calibrated"))
        _CACHE["rec"] = recommend(conversations(600, seed=8, block_tokens=512),
                                  Inputs(30, prefill_servers=4, ttft_slo_s=2.0, itl_slo_s=1.0,
                                         cold_blocks=None), calibrated)
    return _CACHE["rec"]


def build_two_loads(root: Path) -> Path:
    """Request r1's CPU load moves 4 blocks and holds it 40 ms, r2's moves 2 blocks for 10 ms
    (vLLM's hooks stamp every block of one load with the load's time and wait); vLLM's scraped
    counters say its workers copied those 2 jobs in 4 + 2 ms."""
    origin = Origin("vllm", "node-a", "vllm-hooks:node-a")
    events = [BlockEvent(t0, Outcome.CPU_PROMOTION, 100 * n + i, request_id=request, position=i,
                         tokens=16, size_bytes=1 << 20, tier_from=Tier.CPU, tier_to=Tier.GPU,
                         latency_s=wait)
              for n, (request, t0, blocks, wait) in enumerate((("r1", 1_800_000_000.0, 4, 0.040),
                                                               ("r2", 1_800_000_005.0, 2, 0.010)))
              for i in range(blocks)]
    records = [RequestRecord(r, t, 64, tier_config_id="gpu+cpu")
               for r, t in (("r1", 1_800_000_000.0), ("r2", 1_800_000_005.0))]
    scrape = Origin("vllm", "node-a", "vllm-scrape:node-a:http://127.0.0.1:8000/metrics:1")
    intervals = [row for start, copy_s in ((1_799_999_999.0, 0.004), (1_800_000_004.0, 0.002))
                 for row in (MetricInterval(start, start + 2, "vllm:kv_offload_load_time_total",
                                            "counter", copy_s, 'engine="0"'),
                             MetricInterval(start, start + 2, "vllm:kv_offload_load_size", "histogram",
                                            1.0, 'engine="0"', float(1 << 22)),
                             MetricInterval(start, start + 2, "vllm:kv_offload_load_bytes_total",
                                            "counter", float(1 << 22), 'engine="0"'))]
    with TraceStore(":memory:") as store:
        store.ingest(EventBatch.from_rows(origin, 1, events, records))
        store.ingest(EventBatch.from_intervals(scrape, 1, intervals))
        export_segments(store, root)
    return root
