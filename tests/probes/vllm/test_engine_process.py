"""What runs inside an engine process: it imports only what a vLLM install has, and its shipper
flushes on the engine's SIGTERM. Each check runs in a fresh interpreter, as an engine would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvtier.collector.hooks_tap import HooksTap, HooksTapConfig
from kvtier.collector.taps import TapRunner
from tests.conftest import ANY_PORT

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(120)

# What an engine's environment need not have: kvtier's own heavy dependencies.
NOT_IN_AN_ENGINE = ("pyarrow", "duckdb", "sklearn", "streamlit", "msgpack", "opentelemetry",
                    "prometheus_client", "rich", "orjson")
# Of kvtier itself, an engine loads only the schema's side and the probes: not the policy, the
# dashboard, the reference engine or the command line.
IN_AN_ENGINE = ("kvtier", "kvtier.collector", "kvtier.probes")
BLOCKER = textwrap.dedent(f"""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            parts = name.split(".")
            if parts[0] in {NOT_IN_AN_ENGINE!r} or (
                    parts[0] == "kvtier" and ".".join(parts[:2]) not in {IN_AN_ENGINE!r}):
                raise ImportError(f"an engine process has no {{name}}")
    sys.meta_path.insert(0, Block())
""")


def run_python(code: str, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60, **kwargs)


def test_the_in_engine_modules_record_and_ship_without_kvtiers_heavy_dependencies(tmp_path):
    received = []
    tap = TapRunner(HooksTap(HooksTapConfig((ANY_PORT,)), received.append))
    tap.open()
    (where,) = tap.endpoints  # the port bound for :0
    tap.start()
    try:
        done = run_python(f"""
            from kvtier.probes.vllm import accounting, cache_policy, connector, recorders, recording
            from kvtier.probes.vllm.hook_settings import HookSettings
            settings = HookSettings.from_extra_config(
                {{"kvtier_collector": "{where}", "kvtier_instance": "no-deps"}})
            rec = recorders.recorder_for("engine-1", settings)
            import time
            acc = accounting.RequestTokenAccounting(rec, 32, model="m")
            acc.matched("r1", arrival_s=time.time(), prompt_tokens=64, gpu_tokens=32, sources={{}})
            acc.admitted(None, "r1", 0, [b"\\x01" * 32, b"\\x02" * 32])
            acc.finished("r1", status="FINISHED_LENGTH_CAPPED", output_tokens=1)
            rec.record_step(time.time(), 0, 0.01, prefill_tokens=32, prefill_requests=1)
            recorders.flush(5.0)
            import sys
            print("loaded:", sorted(m for m in sys.modules if m.startswith("kvtier.")))
        """)
        assert done.returncode == 0, done.stderr[-3000:]
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        tap.stop()
    (batch,) = received
    assert batch.origin.instance == "no-deps"
    assert batch.requests.column("finish_status").to_pylist() == ["length"]
    assert batch.block_events.column("kind").to_pylist() == ["gpu_hit"]
    assert batch.step_records.column("prefill_tokens").to_pylist() == [32]


def test_a_sigterm_handled_by_the_engine_flushes_what_the_recorders_hold(tmp_path):
    """An engine that handles SIGTERM itself (vLLM's EngineCore raises SystemExit): records
    that the shipper had not shipped yet (a one-hour interval) still reach the collector."""
    received = []
    tap = TapRunner(HooksTap(HooksTapConfig((ANY_PORT,)), received.append))
    tap.open()
    (where,) = tap.endpoints  # the port bound for :0
    tap.start()
    engine = subprocess.Popen([sys.executable, "-c", BLOCKER + textwrap.dedent(f"""
        import signal, sys, time
        def engine_handler(signum, frame):
            raise SystemExit(0)
        signal.signal(signal.SIGTERM, engine_handler)
        from kvtier.collector.events import RequestRecord
        from kvtier.probes.vllm import recorders
        from kvtier.probes.vllm.hook_settings import HookSettings
        settings = HookSettings.from_extra_config(
            {{"kvtier_collector": "{where}", "kvtier_ship_interval_s": 3600}})
        rec = recorders.recorder_for("engine-2", settings)
        for i in range(3):
            rec.record_request(RequestRecord(f"r{{i}}", 1.0, 10))
        print("serving", flush=True)
        while True:
            time.sleep(0.1)
    """)], env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert engine.stdout.readline().strip() == "serving", engine.stderr.read()[-3000:]
        time.sleep(0.5)  # the PUSH socket connects
        assert not received  # nothing shipped before the signal
        engine.send_signal(signal.SIGTERM)
        assert engine.wait(10) == 0
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        engine.kill()
        tap.stop()
    assert sum(b.requests.num_rows for b in received) == 3


def test_bad_kvtier_settings_name_the_key():
    from kvtier.probes.vllm.hook_settings import HookSettings

    with pytest.raises(ValueError, match="kvtier_ship_interval_s must be a number of seconds > 0"):
        HookSettings.from_extra_config({"kvtier_ship_interval_s": "fast"})
    with pytest.raises(ValueError, match="endpoint must be a ZMQ endpoint"):
        HookSettings.from_extra_config({"kvtier_collector": "collector:5570"})
    assert HookSettings.from_extra_config({"kvtier_collector": "in-process"}).shipper is None
