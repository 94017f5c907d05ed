"""Fleet benchmark: `kvtier simulate` and `kvtier evaluate` over two instances' segments,
with --jobs 2 against --jobs 1 (the baseline) in the same run.

Run: ``python benchmarks/fleet.py --json`` (prints one JSON object; a few minutes;
``--smoke``: a few hundred requests, to check it runs).

A trace's requests (``--trace``, default the bundled Mooncake trace) are dealt round-robin to
two instances, each stored by its own store and exported into one segment folder
(``tests/kvtier/fleet_segments.py``).
Each command runs as a fresh ``python -m kvtier`` process, so the wall times include reading
the segments and, with --jobs 2, starting the worker processes. Per verb:
``<verb>_jobs1_s`` / ``<verb>_jobs2_s`` (best of ``--repeat``), ``<verb>_speedup``
(jobs1 / jobs2) and ``<verb>_same_output`` (the two JSON outputs are identical).

* simulate: ``--gpu-tokens 1M --cpu-tokens 4M`` (LRU, three tiers' exclusive flow).
* evaluate: ``--gpu-tokens 1M --cpu-tokens 2.5M`` and every policy (``lru, arc, s3fifo,
  learned, learned-retention, belady``: a model trained per instance).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))



def commands(gpu_tokens: str, cpu_tokens: str, evaluate_cpu_tokens: str, policies: str
             ) -> dict[str, list[str]]:
    return {
        "simulate": ["simulate", "--gpu-tokens", gpu_tokens, "--cpu-tokens", cpu_tokens, "--json"],
        "evaluate": ["evaluate", "--gpu-tokens", gpu_tokens, "--cpu-tokens", evaluate_cpu_tokens,
                     "--policies", policies, "--json"],
    }


COMMANDS = commands("1M", "4M", "2.5M", "lru,arc,s3fifo,learned,learned-retention,belady")
# --smoke: the trace's first requests, tiers scaled down to match, no model to train, one run
SMOKE_REQUESTS, SMOKE_COMMANDS = 300, commands("64K", "256K", "160K", "lru,belady")
# the keys of the --json object with the default --verbs (tests/test_benchmarks.py checks)
FIGURES = ("cpus", "simulate_jobs1_s", "simulate_jobs2_s", "simulate_speedup",
           "simulate_same_output", "evaluate_jobs1_s", "evaluate_jobs2_s", "evaluate_speedup",
           "evaluate_same_output")


def timed(argv: list[str]) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kvtier", *argv], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=1800)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"kvtier {' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return elapsed, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure (best is kept)")
    parser.add_argument("--verbs", default="simulate,evaluate", help="comma-separated")
    parser.add_argument("--trace", help="the trace to deal to two instances (default: the "
                                        "bundled Mooncake trace)")
    parser.add_argument("--smoke", action="store_true", help=f"the trace's first "
                        f"{SMOKE_REQUESTS} requests, no learned policy, one run: seconds, checks "
                        "the benchmark runs (its figures mean nothing)")
    args = parser.parse_args()
    from tests.kvtier.fleet_segments import MOONCAKE, fleet_segments

    result = {"cpus": os.cpu_count()}
    repeat = 1 if args.smoke else args.repeat
    with tempfile.TemporaryDirectory() as folder:
        segments = fleet_segments(Path(folder), trace=Path(args.trace) if args.trace else MOONCAKE,
                                  max_requests=SMOKE_REQUESTS if args.smoke else None)
        for verb in args.verbs.split(","):
            command = (SMOKE_COMMANDS if args.smoke else COMMANDS)[verb]
            base = [command[0], "--trace", str(segments), *command[1:]]
            outputs, best = {}, {}
            for _ in range(repeat):
                for jobs in (1, 2):  # interleaved, so a busy moment hits both
                    elapsed, outputs[jobs] = timed([*base, "--jobs", str(jobs)])
                    best[jobs] = min(best.get(jobs, elapsed), elapsed)
            result[f"{verb}_jobs1_s"] = round(best[1], 2)
            result[f"{verb}_jobs2_s"] = round(best[2], 2)
            result[f"{verb}_speedup"] = round(best[1] / best[2], 2)
            result[f"{verb}_same_output"] = outputs[1] == outputs[2]
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
