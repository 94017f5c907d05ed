"""How often the latency promise's 90% intervals hold: coverage over held-out splits.

A promise is an interval (5th-95th percentile over the latency model's noise draws crossed
with resampled requests, ``kvtier.policy.latency.predict``). Here the engine model is fitted
on the earlier part of a store's requests and predicts the later part (``kvtier.policy.latency
.check.held_out_check``) at several fit shares, on several stores:

* the reference engine serving growing sessions at concurrency 1 and at concurrency 4
  (``tests/policy/engine_model/refengine_store.py``), each written twice with other seeds;
* the demo's store (``kvtier demo --chat-requests 0``), its GPU-only and CPU-tier phases;
* a serving vLLM with a small CPU tier under a RAG-shaped workload, where one is installed
  (``$KVTIER_VLLM_CPU_PYTHON``; ``tests/probes/vllm/rag_workload.py``).

For each store, split and tier configuration, each of TTFT p50/p95/p99 is inside its interval
or not; the figure is the share inside, overall and per store (a 90% interval should hold
80-97% of the time: less, the intervals are too narrow; more, too wide to say anything).
The median |log(predicted/measured)| is printed beside it.

Run: ``python benchmarks/coverage.py --json`` (about five minutes on 2 cores without vLLM;
``--smoke``: one small store, one split).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

FIGURES = ("coverage", "by_store", "median_abs_log_ratio", "rms_log_ratio", "checks")
VLLM_PYTHON = "KVTIER_VLLM_CPU_PYTHON"
SHARES = (0.3, 0.4, 0.5, 0.6, 0.7)
SMOKE = {"requests": 40, "shares": (0.5,), "demo": False, "seeds": 1}


def checks_of(store: Path, shares, kv_blocks: int | None = None, **select) -> list[dict]:
    """The held-out check of ``store``'s selected records at each fit share: per tier
    configuration, each TTFT percentile's ratio and whether it fell inside its interval.
    ``kv_blocks``: the engine's GPU KV blocks where its deployer knows them (``kvtier
    recommend --gpu-tokens``, ``kvtier calibrate --gpu-blocks``, the demo's own calibration)."""
    from kvtier.collector.calibration_inputs import calibration_inputs
    from kvtier.policy.latency.calibration import limits_for
    from kvtier.policy.latency.check import TTFT_FIELDS, held_out_check

    found = calibration_inputs(store, **select)
    limits = limits_for(found.engines, found.requests, found.steps, kv_blocks=kv_blocks)
    rows = []
    for share in shares:
        held = held_out_check(found.requests, found.steps, found.jobs,
                              bytes_per_token=found.kv_bytes_per_token, limits=limits, fit_share=share)
        for check in held.checks:
            inside, ratios = check.inside(), check.predicted.ratios(check.measured)
            rows += [{"share": share, "tier_config": check.tier_config_id, "metric": m,
                      "inside": bool(inside[m]), "ratio": ratios[m]} for m in TTFT_FIELDS]
    return rows


def reference_stores(work: Path, requests: int, seeds: int) -> dict[str, Path]:
    from tests.policy.engine_model.refengine_store import write_store

    stores = {}
    for concurrency in (1, 4):
        for seed in range(seeds):
            path = work / f"ref-c{concurrency}-s{seed}.duckdb"
            write_store(path, concurrency=concurrency, requests=requests, seed=10 * concurrency + seed)
            stores[f"reference c{concurrency} seed {seed}"] = path
    return stores


def demo_store(work: Path) -> Path:
    from kvtier.cli import main as kvtier

    out = work / "demo"
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            code = kvtier(["demo", "--out", str(out), "--chat-requests", "0"])
        finally:
            sys.stdout = stdout
    if code != 0:
        raise SystemExit("kvtier demo failed")
    return out / "kvtier.duckdb"


def vllm_store(python: str, work: Path, requests: int) -> Path:
    """A serving vLLM with an 8 MiB CPU tier under the RAG workload at concurrency 4."""
    import time

    from tests.conftest import free_port
    from tests.probes.vllm.engine_run import load_probe
    from tests.probes.vllm.rag_workload import rag_trace
    from tests.probes.vllm.serving import CollectorProcess, EngineSetup, VllmServer, build_model

    model = build_model(python, work / "model")
    store, hooks = work / "vllm.duckdb", f"tcp://127.0.0.1:{free_port()}"
    trace = rag_trace(work / "rag.jsonl", requests)
    server = VllmServer(python, model, EngineSetup(port=free_port(), hooks=hooks, instance="rag"),
                        work).start()
    collector = None
    try:
        server.wait_ready()
        load_probe(server.url, trace, requests=requests, concurrency=4, vocab=1999)  # warm-up
        collector = CollectorProcess(store, hooks=hooks, instance="rag").start()
        time.sleep(3.0)
        load_probe(server.url, trace, requests=requests, concurrency=4)
    finally:
        server.stop()
        if collector is not None:
            time.sleep(1.0)
            collector.stop()
    return store


def summary(rows_by_store: dict[str, list[dict]]) -> dict:
    every = [r for rows in rows_by_store.values() for r in rows]
    ratios = np.array([r["ratio"] for r in every], dtype=float)
    ratios = ratios[np.isfinite(ratios) & (ratios > 0)]
    return {"coverage": float(np.mean([r["inside"] for r in every])) if every else None,
            "by_store": {name: float(np.mean([r["inside"] for r in rows])) if rows else None
                         for name, rows in rows_by_store.items()},
            "median_abs_log_ratio": float(np.median(np.abs(np.log(ratios)))) if len(ratios) else None,
            "rms_log_ratio": float(np.sqrt(np.mean(np.log(ratios) ** 2))) if len(ratios) else None,
            "checks": len(every)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=160, help="requests per reference store")
    parser.add_argument("--seeds", type=int, default=2, help="reference stores per concurrency")
    parser.add_argument("--vllm-requests", type=int, default=320)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs (the figures mean nothing)")
    args = parser.parse_args()
    shares, with_demo = SHARES, True
    if args.smoke:
        args.requests, args.seeds = SMOKE["requests"], SMOKE["seeds"]
        shares, with_demo = SMOKE["shares"], SMOKE["demo"]
    python = os.environ.get(VLLM_PYTHON)
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="kvtier-coverage-") as tmp:
        work = Path(tmp)
        from tests.policy.engine_model.refengine_store import GPU_BLOCKS

        for name, store in reference_stores(work, args.requests, args.seeds).items():
            rows[name] = checks_of(store, shares, kv_blocks=GPU_BLOCKS)
        if with_demo:
            from kvtier.demo.workloads import agentic

            store, gpu_blocks = demo_store(work), agentic().gpu_blocks
            for phase in ("agentic/gpu-only", "agentic/gpu+cpu"):
                rows[f"demo {phase}"] = checks_of(store, shares, kv_blocks=gpu_blocks,
                                                  engine="reference", tier_config=phase)
        if python and not args.smoke:
            rows["vLLM, RAG, CPU tier, c4"] = checks_of(vllm_store(python, work, args.vllm_requests), shares)
    result = summary(rows)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"90% intervals holding over {result['checks']} held-out checks: {result['coverage']:.0%} "
          f"(|log predicted/measured|: median {result['median_abs_log_ratio']:.2f}, "
          f"root mean square {result['rms_log_ratio']:.2f})")
    for name, share in result["by_store"].items():
        print(f"  {name:<32} {share:.0%}")


if __name__ == "__main__":
    main()
