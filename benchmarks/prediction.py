"""How well kvtier predicts latency: the step-level engine model beside the single-server model.

For each concurrency (1 and 4), kvtier's reference engine serves a short workload of growing
session prompts (``tests/policy/engine_model/refengine_store.py``) into a store; ``kvtier
calibrate`` fits both models on the earlier half of the requests and predicts the later
half; each TTFT and ITL percentile's predicted/measured ratio is printed for both (the
single-server model predicts TTFT only, and fits only where some requests ran alone). Also
the engine model's replay speed on synthetic open-loop traffic.

Run: ``python benchmarks/prediction.py --json`` (about a minute on 2 cores; ``--smoke``: a few
requests, to check it runs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
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
FIGURES = ("levels", "replay")
SMOKE = {"requests": 24, "replay_requests": 200}


def level(concurrency: int, requests: int, work: Path) -> dict:
    """Both models' held-out ratios at one concurrency."""
    store = work / f"c{concurrency}.duckdb"
    write_store(store, concurrency=concurrency, requests=requests, seed=concurrency)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = kvtier(["calibrate", str(store), "--json"])
    if code != 0:
        raise SystemExit(f"kvtier calibrate failed at concurrency {concurrency}")
    held = json.loads(out.getvalue())["engine_model"]
    (check,) = held["by_tier_config"]
    return {"requests": requests, "fitted_from": held["params"]["fitted_from"],
            "closed_loop": check["closed_loop"], "measured": check["measured"],
            "engine_model": check["predicted"], "engine_model_ratio": check["ratio"],
            "single_server": check["single_server"],
            "single_server_ratio": check["single_server_ratio"],
            "single_server_note": held["single_server_note"]}


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
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny inputs: checks the benchmark "
                        "runs (its figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    with tempfile.TemporaryDirectory(prefix="kvtier-prediction-") as tmp:
        levels = {str(c): level(c, args.requests, Path(tmp)) for c in (1, 4)}
    result = {"levels": levels, "replay": replay_speed(args.replay_requests)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for concurrency, body in levels.items():
        print(f"concurrency {concurrency} ({body['fitted_from']}), predicted / measured:")
        for name, ratio in body["engine_model_ratio"].items():
            single = (body["single_server_ratio"] or {}).get(name)
            old = f"   single-server {single:.2f}" if single is not None and np.isfinite(single) else ""
            print(f"  {name:<11} engine model {ratio:.2f}{old}")
    r = result["replay"]
    print(f"replay: {r['requests']} requests, {r['steps']} steps in {r['seconds']:.2f} s")


if __name__ == "__main__":
    main()
