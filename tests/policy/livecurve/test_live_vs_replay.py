"""The live curve against the simulator's offline replay of the same requests, at every
ladder size: a fleet of 64 instances under vLLM's semantics (copy-on-store CPU tier, its
file tier) and exclusive tiers, and the bundled Mooncake trace. The curve's stated error is
at most 1 point of token hit ratio; on these traces it is exact."""

from __future__ import annotations

import pytest

from kvtier.policy.livecurve.config import CurveConfig
from kvtier.policy.livecurve.live_curves import LiveCurves
from kvtier.policy.readers import open_trace
from tests.conftest import FixedClock
from tests.kvtier.fleet_segments import MOONCAKE
from tests.policy.livecurve.fleet_traffic import (fleet_batches, instance_requests,
                                                  replayed_hit_ratio)

TOLERANCE = 0.01  # one point of token hit ratio: the curve's stated error bound
# every size holds the largest prompt (MAX_BLOCKS): vLLM stores nothing of a request whose
# new blocks do not fit its CPU tier at once, which a stack cannot say (see live_curves.py)
GPU_TOKENS = 64 * 16
LADDER = (0, 768, 1536, 3072, 6144)
COLD_LADDER = (768, 1536, 4096)
COLD_ABOVE = 768


def curves_of(batches, config: CurveConfig) -> dict:
    clock = FixedClock()
    curves = LiveCurves(config, collector="test", clock=clock)
    for batch in batches:
        curves.observe(batch)
        clock.advance(1.0)
    curves.flush()
    return {(c.engine, c.instance): c for c in curves.refresh().instances}


@pytest.fixture(scope="module")
def fleet():
    names = [f"node-{i:02d}" for i in range(64)]
    traffic = {name: instance_requests(seed=i, requests=80, name=name) for i, name in enumerate(names)}
    engines = {name: ("vllm" if i % 2 else "sglang") for i, name in enumerate(names)}
    config = CurveConfig(cpu_ladder_tokens=LADDER, cold_ladder_tokens=COLD_LADDER,
                         cold_above_cpu_tokens=COLD_ABOVE, gpu_tokens=GPU_TOKENS)
    return traffic, engines, curves_of(fleet_batches(traffic, engines), config)


def test_a_fleet_of_64_instances_matches_the_replay_at_every_size(fleet):
    traffic, engines, curves = fleet
    assert len(curves) == 64
    worst = 0.0
    for name, records in traffic.items():
        curve = curves[(engines[name], name)]
        semantics = "vllm" if engines[name] == "vllm" else "exclusive"
        assert curve.semantics == semantics and curve.gpu_source == "given"
        window = curve.window("all")
        assert window.requests == len(records)
        for point in window.points:
            cpu, cold = ((point.size_tokens, 0) if point.tier == "cpu"
                         else (COLD_ABOVE, point.size_tokens))
            expected = replayed_hit_ratio(records, semantics, GPU_TOKENS, cpu, cold)
            worst = max(worst, abs(point.hit_ratio - expected))
            assert point.hit_ratio == pytest.approx(expected, abs=TOLERANCE), (name, point)
    assert worst < 1e-9  # exact on this traffic: each request looked up, then applied


def test_the_fleet_curves_rise_with_size_and_reach_their_hits(fleet):
    """Exclusive tiers are one LRU stack: more room never serves less. (vLLM's CPU tier is
    no stack: a request that loads nothing offers its GPU hits, so a larger tier can serve
    a little less; the serving vLLM's store shows it, and the replay agrees.)"""
    _, _, curves = fleet
    for curve in curves.values():
        window = curve.window("all")
        cpu = [p.hit_ratio for p in window.points if p.tier == "cpu"]
        assert cpu[0] == pytest.approx(window.gpu_hit_ratio)
        if curve.semantics == "exclusive":
            assert cpu == sorted(cpu)
        sizes = [r.size_tokens for r in window.reach]
        assert sizes == sorted(sizes) and sizes[-1] <= LADDER[-1] + 16 * 16
        assert window.reachable_cpu_hit_tokens >= 0


@pytest.mark.parametrize("engine", ["vllm", "reference"])
def test_the_mooncake_trace_matches_the_replay(engine):
    records = list(open_trace(MOONCAKE).requests())[:3000]
    from kvtier.collector.batch import EventBatch
    from kvtier.collector.events import Origin

    origin = Origin(engine, "mooncake", "trace:mooncake")
    batches = [EventBatch.from_rows(origin, i, requests=records[i * 500:(i + 1) * 500])
               for i in range(6)]
    ladder = (0, 51_200, 512_000, 1_536_000, 5_120_000)
    config = CurveConfig(cpu_ladder_tokens=ladder, gpu_tokens=102_400)
    curve = curves_of(batches, config)[(engine, "mooncake")]
    semantics = "vllm" if engine == "vllm" else "exclusive"
    for point in curve.window("all").points:
        expected = replayed_hit_ratio(records, semantics, 102_400, point.size_tokens,
                                      block_tokens=512)
        assert point.hit_ratio == pytest.approx(expected, abs=TOLERANCE)
    ratios = [p.hit_ratio for p in curve.window("all").points]
    assert ratios[-1] > ratios[0] + 0.05  # the trace has reuse beyond the GPU


def test_group_commits_show_the_curves_what_one_batch_at_a_time_shows(fleet, tmp_path):
    """A collector that commits several shipments at once hands the curves each engine
    stream's share of a commit as one batch: the curves come out as they do fed one batch at
    a time (the fixture's), point for point."""
    from dataclasses import replace

    from kvtier.collector.service import CollectorConfig, CollectorService

    traffic, engines, one_at_a_time = fleet
    config = CurveConfig(cpu_ladder_tokens=LADDER, cold_ladder_tokens=COLD_LADDER,
                         cold_above_cpu_tokens=COLD_ABOVE, gpu_tokens=GPU_TOKENS)
    clock = FixedClock()
    curves = LiveCurves(config, collector="test", clock=clock)
    service = CollectorService(CollectorConfig(store_path=tmp_path / "kvtier.duckdb",
                                               metrics_port=None, export_every_s=3600),
                               observers=[curves], clock=clock).start()
    batches = list(fleet_batches(traffic, engines, per_batch=8))
    try:
        for at in range(0, len(batches), 96):  # 96 shipments a commit: 64 streams, some twice
            assert all(service.ingest_many(batches[at:at + 96]))
            clock.advance(1.0)
    finally:
        service.stop()
    curves.flush()
    grouped = {(c.engine, c.instance): c for c in curves.refresh().instances}
    assert grouped.keys() == one_at_a_time.keys()
    for key, curve in grouped.items():  # all but the clock's span, which moved a commit a tick
        assert replace(curve.window("all"), span_s=0) == replace(
            one_at_a_time[key].window("all"), span_s=0), key
