"""Fleet benchmark on Ray: `kvtier recommend` for every instance of a 64-instance fleet,
through the local pool (``--jobs 2``) and through a Ray cluster with two worker processes
(``--ray``), in the same run: the same recommendations, wall times side by side.

Run: ``python benchmarks/fleet_ray.py --json`` (one JSON object; several minutes;
``--smoke``: four instances, to check it runs). Needs Ray (``pip install 'kvtier[ray]'``).

The bundled Mooncake trace's requests are dealt round-robin to ``--instances`` instances,
each stored by its own store and exported into one shared segment folder (the fleet recipe
in README, ``tests/kvtier/fleet_segments.py``). The cluster is this machine's: a head and a
second node process, one CPU each (``tests/kvtier/ray_cluster.py``), started before the
timed run. Each command is a fresh ``python -m kvtier`` process, so both wall times include
reading the segments and starting the workers (the pool's processes, Ray's tasks).

* ``local_jobs2_s`` / ``ray_two_workers_s``: wall seconds of each, ``ray_over_local`` the
  ratio; ``same_recommendations``: every instance's verdict and settings (``fleet.json``)
  equal; ``differing_instances`` lists any that are not.
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

FIGURES = ("instances", "requests", "cpus", "local_jobs2_s", "ray_two_workers_s",
           "ray_over_local", "same_recommendations", "differing_instances")
SMOKE = {"instances": 4, "requests_per_instance": 45}
RECOMMEND = ["recommend", "--gpu-tokens", "64k", "--cpu-tokens", "256k", "--engine", "vllm",
             "--host-headroom-bytes", str(64 << 30)]


def timed(argv: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kvtier", *argv], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=3600)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"kvtier {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return elapsed


def recommendations(out: Path) -> dict:
    """Each instance's verdict and settings, as ``fleet.json`` lists them."""
    index = json.loads((out / "fleet.json").read_text())
    return {p["instance"]: {k: v for k, v in p.items() if k != "out"} for p in index["instances"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--requests-per-instance", type=int, default=60,
                        help="recommend needs 40 at least (half to train, half to measure)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--smoke", action="store_true", help="four instances: checks the "
                        "benchmark runs (its figures mean nothing)")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    from tests.kvtier.fleet_segments import fleet_segments
    from tests.kvtier.ray_cluster import LocalRayCluster

    names = tuple(f"node-{i:03d}" for i in range(args.instances))
    requests = args.instances * args.requests_per_instance
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        segments = fleet_segments(root, names, max_requests=requests)
        command = [*RECOMMEND, "--trace", str(segments)]
        local_s = timed([*command, "--out", str(root / "local"), "--jobs", "2"])
        with LocalRayCluster(root / "cluster-files", nodes=2, cpus_per_node=1) as cluster:
            ray_s = timed([*command, "--out", str(root / "ray"), "--ray", cluster.address])
        local, on_ray = recommendations(root / "local"), recommendations(root / "ray")
    differing = sorted(n for n in set(local) | set(on_ray) if local.get(n) != on_ray.get(n))
    figures = {"instances": args.instances, "requests": requests, "cpus": os.cpu_count(),
               "local_jobs2_s": local_s, "ray_two_workers_s": ray_s,
               "ray_over_local": ray_s / local_s,
               "same_recommendations": not differing and len(local) == args.instances,
               "differing_instances": differing}
    if args.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))
    else:
        for key, value in figures.items():
            print(f"{key:24s} {value:,.3f}" if isinstance(value, float) else f"{key:24s} {value}")


if __name__ == "__main__":
    main()
