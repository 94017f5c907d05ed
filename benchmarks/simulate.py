"""Simulator benchmark: the compiled replay against the pure-Python flows it replaced and
libCacheSim, on the same block stream in the same run; and the one-pass WEKA curve.

Run: ``python benchmarks/simulate.py --json`` (one JSON object; the Mooncake conversation
trace is the copy bundled in ``kvtier/data``, WEKA comes from ``--traces``; ``--smoke``: a few
hundred requests, no WEKA, to check it runs).

Replays (records already in memory, GPU 2,000 / CPU 10,000 / cold 50,000 blocks of the trace's
512 tokens; the trace's arrays built once before timing, as ``evaluate`` builds them once):
* ``vllm_lru_accesses_per_s``: block references per second, 3-tier LRU under vLLM semantics;
  ``exclusive_lru_accesses_per_s`` the same with exclusive tiers;
* ``learned_admission_accesses_per_s`` / ``learned_retention_accesses_per_s``: exclusive GPU
  LRU + CPU tier behind a learned admitter (random scores per offer, threshold 0.5, chained) /
  ordered by learned retention (tau 100 s) — what ``evaluate`` replays for the learned rows;
* ``learned_next_use_accesses_per_s`` / ``learned_safe_accesses_per_s``: the CPU tier in the
  learned next-use order (fitted on the first half of the requests, readout ``next_use``),
  alone / behind its LRU shadow, the model's views of every request computed in the timing;
  ``python_learned_next_use_accesses_per_s`` the order alone through the per-key oracle;
* ``python_*_accesses_per_s``: the same replays through the pure-Python flows the core
  replaced (kept as the test oracle in ``tests/policy/sim/oracle``), the baseline;
* ``libcachesim_accesses_per_s``: libCacheSim's LRU (PyPI ``libcachesim``) fed the single-tier
  block stream one ``get`` at a time from Python (``null`` when not installed).
* ``weka_curve_s``: reading the 600 WEKA conversations and the LRU curve in one pass.
* ``weka_*``: the same conversations at 64-token blocks read into arrays once
  (``weka_read_s``), then 3-tier LRU replays of all of them (GPU 6,400 / CPU 12,800 / cold
  25,600 blocks) under vLLM and exclusive semantics: accesses/s (the trace interned
  before timing), and ``weka_distinct_blocks``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvtier.policy.curves import lru_curve  # noqa: E402
from kvtier.policy.learn.replay import IndexedAdmitter, Tiers, replay  # noqa: E402
from kvtier.policy.learn.retention import factory  # noqa: E402
from kvtier.policy.readers import MooncakeReader, WekaReader  # noqa: E402
from kvtier.policy.sim.config import SimConfig  # noqa: E402
from kvtier.policy.sim.simulator import Simulator  # noqa: E402
from kvtier.policy.sim.trace import BlockTrace  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
MOONCAKE = ROOT / "kvtier" / "data" / "mooncake_conversation_trace.jsonl.gz"
SIZES = dict(gpu_blocks=2000, cpu_blocks=10000, cold_blocks=50000)
SMOKE_REQUESTS = 400  # --smoke: the Mooncake trace's first requests only, no WEKA
# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("block_refs", "vllm_lru_accesses_per_s", "exclusive_lru_accesses_per_s",
           "learned_admission_accesses_per_s", "learned_retention_accesses_per_s",
           "python_vllm_lru_accesses_per_s", "python_exclusive_lru_accesses_per_s",
           "learned_next_use_accesses_per_s", "learned_safe_accesses_per_s",
           "python_learned_next_use_accesses_per_s", "libcachesim_accesses_per_s",
           "speedup_vllm_lru", "ratio_vs_libcachesim", "weka_curve_s", "weka_block_refs")


def rate(fn, refs: int, repeat: int = 3) -> float:
    """Block references per second of ``fn()``, best of ``repeat``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return refs / best


def compiled_rates(records, trace: BlockTrace) -> dict:
    refs = trace.block_refs
    out = {}
    for semantics in ("vllm", "exclusive"):
        config = SimConfig(**SIZES, semantics=semantics, default_block_tokens=512)
        out[f"{semantics}_lru_accesses_per_s"] = rate(
            lambda: Simulator(config).replay_trace(trace), refs)
    tiers = Tiers(SIZES["gpu_blocks"], SIZES["cpu_blocks"])
    scores = learned_scores(records, tiers)
    out["learned_admission_accesses_per_s"] = rate(
        lambda: replay(records, tiers, "lru", admitter=IndexedAdmitter(scores, 0.5),
                       trace=trace), refs)
    out["learned_retention_accesses_per_s"] = rate(
        lambda: replay(records, tiers, factory(scores, 100.0), trace=trace), refs)
    return out


def next_use_rates(records, trace: BlockTrace) -> dict:
    """The learned next-use order, compiled alone and shadowed, and per key (the oracle)."""
    from kvtier.policy.learn.deploy import learned_factory
    from kvtier.policy.learn.nextuse import Readout
    from kvtier.policy.learn.nextuse_fit import fit_next_use
    from kvtier.policy.learn.signal_table import signal_table
    from tests.policy.learn.oracle_nextuse import NextUseTier, replay_per_key

    model = fit_next_use(records[:len(records) // 2])
    signals = signal_table(records, trace, model.models)
    tiers, readout = Tiers(SIZES["gpu_blocks"], SIZES["cpu_blocks"]), Readout()
    refs = trace.block_refs
    out = {}
    for name, shadowed in (("learned_next_use", False), ("learned_safe", True)):
        build = learned_factory(model, readout, signals, shadowed=shadowed)
        out[f"{name}_accesses_per_s"] = rate(lambda: replay(records, tiers, build, trace=trace),
                                             refs)
    out["python_learned_next_use_accesses_per_s"] = rate(
        lambda: replay_per_key(records, tiers, lambda c: NextUseTier(c, model, readout)), refs,
        repeat=1)
    return out


def learned_scores(records, tiers: Tiers) -> dict:
    from kvtier.policy.learn.offers import collect_offers

    offers = collect_offers(records, tiers.gpu_blocks, tiers.cpu_blocks, label=False)
    rng = random.Random(0)
    return {(int(i), int(k)): rng.random() for i, k in zip(offers.request_index, offers.keys)}


def python_rates(records) -> dict:
    """The pure-Python flows (the test oracle), on the same records: the baseline."""
    sys.path.insert(0, str(ROOT))
    from tests.policy.sim.oracle.simulator import Simulator as OracleSimulator

    refs = sum(len(r.block_hashes) for r in records)
    out = {}
    for semantics in ("vllm", "exclusive"):
        config = SimConfig(**SIZES, semantics=semantics, default_block_tokens=512)
        out[f"python_{semantics}_lru_accesses_per_s"] = rate(
            lambda: OracleSimulator(config).replay(records), refs, repeat=1)
    return out


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


def weka_replays(path: Path) -> dict:
    from kvtier.policy.sim.trace import strip_blocks

    start = time.perf_counter()
    _, trace = strip_blocks(WekaReader(path).requests())
    out = {"weka_read_s": time.perf_counter() - start, "weka_block_refs": trace.block_refs}
    for semantics in ("vllm", "exclusive"):
        config = SimConfig(gpu_blocks=6400, cpu_blocks=12800, cold_blocks=25600,
                           semantics=semantics, default_block_tokens=64)
        flow = Simulator(config).flow.compiled
        ids = flow.ids(trace.hashes)
        start = time.perf_counter()
        flow.replay(ids, trace.offsets, trace.prompt_tokens, trace.block_tokens)
        seconds = time.perf_counter() - start
        distinct = len(flow.interner)
        out[f"weka_{semantics}_lru_accesses_per_s"] = trace.block_refs / seconds
        out["weka_distinct_blocks"] = distinct
    return out


def weka_curve(path: Path) -> tuple[float, int, float]:
    start = time.perf_counter()
    curve = lru_curve(WekaReader(path).requests(), 64)
    return time.perf_counter() - start, curve.block_refs, curve.token_hit_ratio(None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--skip-weka", action="store_true", help="leave out the WEKA curve")
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder of the real traces")
    parser.add_argument("--smoke", action="store_true", help=f"the first {SMOKE_REQUESTS} "
                        "requests, no WEKA: seconds, checks the benchmark runs (figures mean nothing)")
    args = parser.parse_args()
    records = list(MooncakeReader(MOONCAKE).requests())[:SMOKE_REQUESTS if args.smoke else None]
    trace = BlockTrace.from_records(records, 512)
    out = {"block_refs": trace.block_refs, **compiled_rates(records, trace),
           **python_rates(records), **next_use_rates(records, trace),
           "libcachesim_accesses_per_s": libcachesim_rate(records, SIZES["cpu_blocks"])}
    base = out["python_vllm_lru_accesses_per_s"]
    out["speedup_vllm_lru"] = out["vllm_lru_accesses_per_s"] / base
    lcs = out["libcachesim_accesses_per_s"]
    out["ratio_vs_libcachesim"] = out["vllm_lru_accesses_per_s"] / lcs if lcs else None
    out.update(weka_curve_s=None, weka_block_refs=None)
    weka = args.traces / "weka" / "traces_dev.tar.gz"
    if not (args.skip_weka or args.smoke) and weka.exists():
        seconds, refs, ideal = weka_curve(weka)
        out.update(weka_curve_s=seconds, weka_block_refs=refs, weka_ideal_token_hit_ratio=ideal)
        out.update(weka_replays(weka))
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:36} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
