"""Simulator benchmark: replay speed against libCacheSim, and the one-pass WEKA curve.

Run: ``python benchmarks/simulate.py --json`` (one JSON object). Needs ``../shared/traces``.

* ``accesses_per_s``: block references per second of a 3-tier LRU replay (exclusive tiers,
  GPU 2,000 / CPU 10,000 / cold 50,000 blocks of 512 tokens) of the Mooncake conversation
  trace, records already in memory. ``single_tier_accesses_per_s`` is the same for a
  single-tier LRU of 10,000 blocks.
* ``libcachesim_accesses_per_s``: libCacheSim's LRU (PyPI ``libcachesim``) fed the same
  single-tier block stream one ``get`` at a time from Python; ``null`` when not installed.
  ``ratio_vs_libcachesim`` = ``accesses_per_s / libcachesim_accesses_per_s``.
* ``weka_curve_s``: reading the 600 local WEKA conversations and computing the LRU hit-ratio
  curve at every capacity in one pass; ``weka_block_refs`` block references in them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policy.curves import lru_curve
from policy.readers import MooncakeReader, WekaReader
from policy.sim.config import SimConfig
from policy.sim.simulator import simulate

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def replay_rate(records, config: SimConfig) -> tuple[float, float]:
    start = time.perf_counter()
    result = simulate(records, config)
    elapsed = time.perf_counter() - start
    return result.block_refs / elapsed, result.token_hit_ratio


def libcachesim_rate(records, capacity_blocks: int) -> float | None:
    try:
        import libcachesim as lcs
    except ImportError:
        return None
    stream = [h for record in records for h in record.block_hashes]
    cache = lcs.LRU(cache_size=capacity_blocks)
    req = lcs.Request()
    req.obj_size = 1
    start = time.perf_counter()
    for h in stream:
        req.obj_id = h
        cache.get(req)
    return len(stream) / (time.perf_counter() - start)


def weka_curve(path: Path) -> tuple[float, int, float]:
    start = time.perf_counter()
    curve = lru_curve(WekaReader(path).requests(), 64)
    return time.perf_counter() - start, curve.block_refs, curve.token_hit_ratio(None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--skip-weka", action="store_true", help="leave out the WEKA curve")
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder of the real traces")
    args = parser.parse_args()
    mooncake = args.traces / "mooncake" / "conversation_trace.jsonl"
    if not mooncake.exists():
        print(f"no trace at {mooncake}", file=sys.stderr)
        return 2
    records = list(MooncakeReader(mooncake).requests())
    three_tier = SimConfig(gpu_blocks=2000, cpu_blocks=10000, cold_blocks=50000)
    rate, ratio = replay_rate(records, three_tier)
    single_rate, _ = replay_rate(records, SimConfig(gpu_blocks=10000))
    reference = libcachesim_rate(records, 10000)
    out = {"accesses_per_s": rate, "three_tier_token_hit_ratio": ratio,
           "single_tier_accesses_per_s": single_rate,
           "libcachesim_accesses_per_s": reference,
           "ratio_vs_libcachesim": rate / reference if reference else None,
           "weka_curve_s": None, "weka_block_refs": None}
    weka = args.traces / "weka" / "traces_dev.tar.gz"
    if not args.skip_weka and weka.exists():
        seconds, refs, ideal = weka_curve(weka)
        out.update(weka_curve_s=seconds, weka_block_refs=refs, weka_ideal_token_hit_ratio=ideal)
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
