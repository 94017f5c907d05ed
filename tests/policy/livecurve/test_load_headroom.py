"""The tier-aware headroom signal: how many times the load fits in the p99 TTFT budget under
the queue model, with the tiers as they serve and with the offload tiers' tokens recomputed;
the prefill each tier saves per second; where the costs came from."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin, RequestRecord
from kvtier.policy.cost import CostParams
from kvtier.policy.livecurve.config import CurveConfig
from kvtier.policy.livecurve.live_curves import LiveCurves
from kvtier.policy.livecurve.load_headroom import headroom, load_factor
from tests.conftest import FixedClock

PREFILL = CostParams().prefill_tokens_per_s.value  # kvtier's default, 8,000 tokens a second


def rows(n: int, cpu: int, recomputed: int) -> np.ndarray:
    """``n`` requests one second apart: (arrival, prompt, gpu, cpu, cold, recomputed)."""
    return np.array([[float(i), cpu + recomputed, 0, cpu, 0, recomputed] for i in range(n)])


def test_requests_a_second_apart_that_take_a_tenth_fit_ten_times_the_load():
    # 800 recomputed tokens take 0.1 s: up to 10 requests a second none waits; beyond, the
    # queue grows by the excess each request and p99 passes a 0.15 s budget
    arrivals, services = np.arange(100.0), np.full(100, 800 / PREFILL)
    assert services[0] == pytest.approx(0.1)
    assert 9.9 <= load_factor(arrivals, services, 0.15) <= 10.2
    assert load_factor(arrivals, services, 0.05) == pytest.approx(1 / 64)  # never within
    assert load_factor(arrivals, services, 1e6) == 64.0  # always within


def test_the_offload_tiers_buy_load_and_the_signal_names_default_costs():
    room = headroom(rows(100, cpu=700, recomputed=100), CostParams(), "default", 0.15)
    assert room.costs == "default" and room.requests == 100 and room.span_s == 99.0
    assert room.saved_tokens_per_s["cpu"] == pytest.approx(700 * 100 / 99)
    assert room.recomputed_tokens_per_s == pytest.approx(100 * 100 / 99)
    assert 9.9 <= room.load_factor_without_offload <= 10.2  # as if all 800 were recomputed
    assert room.load_factor > 3 * room.load_factor_without_offload
    assert 0 < room.utilisation < 0.1


def test_the_live_curves_carry_the_headroom_of_requests_with_a_measured_split(tmp_path):
    cost_file = tmp_path / "costs.json"
    cost_file.write_text(json.dumps({"probe": "calibrate",
                                     "cost_params": {"prefill_tokens_per_s": 4000.0}}))
    clock = FixedClock()
    curves = LiveCurves(CurveConfig(cpu_ladder_tokens=(0, 1024), gpu_tokens=1024, ttft_budget_s=0.3),
                        collector="c", cost_file=cost_file, clock=clock)
    origin = Origin("reference", "node-a", "node-a/1")
    records = [RequestRecord(f"r{i}", 1000.0 + i, 800, block_hashes=tuple(range(i, i + 50)),
                             block_size_tokens=16, gpu_hit_tokens=400, cpu_promotion_tokens=200,
                             cold_promotion_tokens=0, recomputed_tokens=200) for i in range(50)]
    curves.observe(EventBatch.from_rows(origin, 0, requests=records))
    curves.flush()
    room = curves.refresh().instances[0].headroom
    assert room.costs == "calibrated" and room.requests == 50
    assert room.saved_tokens_per_s == pytest.approx({"gpu": 400 * 50 / 49, "cpu": 200 * 50 / 49,
                                                     "cold": 0.0})
    assert room.load_factor > room.load_factor_without_offload > 1
    names = {(s.name, s.labels.get("tiers")) for s in curves.samples()}
    assert {("kvtier_headroom_load_factor", "as_served"),
            ("kvtier_headroom_load_factor", "without_offload")} <= names
    gains = [p.saved_prefill_s_per_gib for p in curves.snapshot().instances[0].window("all").points]
    assert gains[0] is None and gains[1] is not None  # priced: a cost file was given
