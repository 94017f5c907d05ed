"""The live curve on the store `kvtier demo` writes (kvtier's reference engine serving agentic
sessions, its block events and requests as the collector stored them), against the offline
replay of the same store at each ladder size: within the stated error of 1 point."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kvtier.collector.reader import StoreReader
from kvtier.collector.store import TraceStore
from kvtier.policy.livecurve.config import CurveConfig
from kvtier.policy.livecurve.live_curves import LiveCurves
from tests.conftest import FixedClock
from tests.policy.livecurve.fleet_traffic import replayed_hit_ratio, stored_batches

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LADDER = (0, 256, 512, 1024, 2048, 4096, 8192)


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    done = subprocess.run([sys.executable, "-m", "kvtier", "demo", "--requests", "120",
                           "--chat-requests", "0", "--out", str(out)], capture_output=True,
                          text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    gpu_tokens = int(re.search(r"--gpu-tokens (\d+)", done.stdout).group(1))  # its GPU tier
    return out / "kvtier.duckdb", gpu_tokens


def test_the_live_curve_of_the_demos_store_equals_its_replay(demo_store):
    path, gpu_tokens = demo_store
    clock = FixedClock()
    curves = LiveCurves(CurveConfig(cpu_ladder_tokens=LADDER, gpu_tokens=gpu_tokens),
                        collector="demo", clock=clock)
    for batch in stored_batches(path):
        curves.observe(batch)
        clock.advance(5.0)
    curves.flush()
    found = {(c.engine, c.instance): c for c in curves.refresh().instances}
    engine = found[("reference", "demo-engine")]  # the engine's own records (the load probe's too)
    assert engine.semantics == "exclusive" and engine.kv_bytes_source == "measured"
    with TraceStore(path, read_only=True) as store:
        for (name, instance), curve in found.items():
            records = list(StoreReader(store, instance=instance, engine=name).requests())
            window = curve.window("all")
            assert window.requests == len(records) > 100
            for point in window.points:
                expected = replayed_hit_ratio(records, "exclusive", gpu_tokens, point.size_tokens)
                assert point.hit_ratio == pytest.approx(expected, abs=0.01), (name, point)
    ratios = [p.hit_ratio for p in engine.window("all").points]
    assert ratios == sorted(ratios) and ratios[-1] > ratios[0] + 0.1  # a CPU tier pays here
