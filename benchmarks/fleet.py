"""Fleet benchmark: `kvtier simulate` and `kvtier evaluate` over two instances' segments,
with --jobs 2 against --jobs 1 (the baseline) in the same run.

Run: ``python benchmarks/fleet.py --json`` (prints one JSON object; a few minutes).

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

COMMANDS = {
    "simulate": ["simulate", "--gpu-tokens", "1M", "--cpu-tokens", "4M", "--json"],
    "evaluate": ["evaluate", "--gpu-tokens", "1M", "--cpu-tokens", "2.5M",
                 "--policies", "lru,arc,s3fifo,learned,learned-retention,belady", "--json"],
}


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
    args = parser.parse_args()
    from tests.kvtier.fleet_segments import fleet_segments

    result = {"cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as folder:
        segments = (fleet_segments(Path(folder), trace=Path(args.trace)) if args.trace
                    else fleet_segments(Path(folder)))
        for verb in args.verbs.split(","):
            base = [*COMMANDS[verb][:1], "--trace", str(segments), *COMMANDS[verb][1:]]
            outputs, best = {}, {}
            for _ in range(args.repeat):
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
