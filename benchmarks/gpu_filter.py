"""kvtier's GPU prefix-cache sighting filter inside vLLM: what caching a block only from its
second request costs vLLM's scheduler, in memory and per prompt block, beside the same
scheduler caching every block, on the same requests in the same run.

Run: ``python benchmarks/gpu_filter.py --json`` (needs a vLLM environment, ``$KVTIER_VLLM_PYTHON``
or ``.venv-vllm``; about a minute; ``--smoke``: tiny inputs, to check it runs). Requests of
``--blocks`` blocks, a ``--repeat`` share of them a prompt sent before, go through vLLM's real
``KVCacheManager`` (its block hasher, ``get_computed_blocks``, ``allocate_slots``, ``free``),
once as vLLM ships it and once with kvtier's filter installed in its ``BlockPool`` and each
request counted as kvtier's connector counts it (``kvtier.probes.vllm.gpu_filter``), each in
its own process (the filter is installed once per process), ``--rounds`` times alternating,
medians printed. More distinct blocks are sent than
the tracker holds, so it is full. Printed: microseconds per prompt block for the scheduler's
path in each (the difference is the filter's cost: counting, the mask ``cache_full_blocks`` is
given, and what caching fewer blocks saves), and of it the connector's count alone; the bytes
the tracker holds (tracemalloc: what emptying it frees, its entries and the hashes only it
keeps), per tracked block and at the default 64,000; and the share of prompt blocks that were
GPU hits in each (the filter's effect on this traffic, where a repeated prompt is sent once
before).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.vllm_side import (add_traffic_arguments, prompts, report,  # noqa: E402
                                  run_inside, traffic_options, vllm_python)

ENGINE_ENV = "KVTIER_VLLM_PYTHON"  # the vLLM environment the scheduler's cache runs in
# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("blocks_per_request", "max_tracked", "prompt_blocks", "baseline_us_per_block",
           "filter_us_per_block", "counting_us_per_block", "tracker_bytes",
           "bytes_per_tracked_block", "bytes_at_default_tracker", "tracked_blocks",
           "baseline_hit_share", "filter_hit_share", "rounds", "filter_to_baseline",
           "load_average")
SMOKE = {"tracker": 500, "requests": 300, "gpu_blocks": 256, "rounds": 1}  # --smoke's sizes
BLOCK_TOKENS = 16


def _drive(filtered: bool, tracker: int, gpu_blocks: int, requests: int, blocks: int,
           repeat: float) -> dict:
    """In a vLLM process: every request counted (as kvtier's connector counts it), looked up,
    allocated and freed; with ``filtered``, kvtier's filter installed first. Then the
    tracker's bytes: what emptying it frees (traced from before the first request)."""
    import gc
    import tracemalloc

    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    from kvtier.probes.vllm import gpu_filter

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(BLOCK_TOKENS, hash_fn)
    spec = FullAttentionSpec(block_size=BLOCK_TOKENS, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)

    def manager():
        return KVCacheManager(
            KVCacheConfig(num_blocks=gpu_blocks, kv_cache_tensors=[],
                          kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)]),
            max_model_len=1 << 16, scheduler_block_size=BLOCK_TOKENS,
            hash_block_size=BLOCK_TOKENS, enable_caching=True)

    def serve(cache) -> tuple[float, float, int, int]:
        elapsed = counting_s = 0.0
        count = hits = 0
        for i, ids in enumerate(prompts(requests, blocks, repeat)):
            # whole blocks and one token more: the prompt's blocks can all be hits
            tokens = [token for block in ids for token in [block] * BLOCK_TOKENS] + [0]
            request = Request(f"r{i}", tokens, SamplingParams(max_tokens=1), None,
                              block_hasher=hasher)
            began = time.perf_counter()
            gpu_filter.sight(request)  # the connector's count: a no-op without the filter
            counted = time.perf_counter()
            computed, hit_tokens, _ = cache.get_computed_blocks(request)
            cache.allocate_slots(request, request.num_tokens - hit_tokens,
                                 num_new_computed_tokens=hit_tokens,
                                 new_computed_blocks=computed)
            cache.free(request)
            elapsed += time.perf_counter() - began
            counting_s += counted - began
            count += len(ids)
            hits += hit_tokens // BLOCK_TOKENS
        return elapsed, counting_s, count, hits

    sightings = gpu_filter.install(2, tracker) if filtered else None
    elapsed, counting_s, count, hits = serve(manager())  # timed, untraced
    tracked = freed = 0
    if sightings is not None:  # again, traced (tracemalloc slows what it traces)
        sightings.counts.clear()
        tracemalloc.start()
        serve(manager())
        gc.collect()
        tracked = len(sightings.counts)
        before = tracemalloc.get_traced_memory()[0]
        sightings.counts.clear()
        gc.collect()
        freed = before - tracemalloc.get_traced_memory()[0]
    return {"us_per_block": elapsed / max(1, count) * 1e6, "prompt_blocks": count,
            "counting_us_per_block": counting_s / max(1, count) * 1e6,
            "hit_share": hits / max(1, count), "tracker_bytes": freed, "tracked": tracked}


def _inside(python: str, filtered: bool, args) -> dict:
    return run_inside(python, __file__, [
        "--inside", "filter" if filtered else "plain", "--tracker", str(args.tracker),
        "--gpu-blocks", str(args.gpu_blocks), *traffic_options(args)])


def main() -> int:
    from kvtier.probes.vllm.gpu_filter import MAX_TRACKED

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracker", type=int, default=MAX_TRACKED,
                        help="blocks the filter's tracker holds")
    parser.add_argument("--gpu-blocks", type=int, default=4096, help="vLLM's GPU pool in blocks")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each, alternating (the medians are printed)")
    add_traffic_arguments(parser)  # --inside: plain or filter
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.inside:
        report(_drive(args.inside == "filter", args.tracker, args.gpu_blocks, args.requests,
                      args.blocks, args.repeat))
        return 0
    python = vllm_python()
    if python is None:
        return 2
    runs = [(_inside(python, False, args), _inside(python, True, args))
            for _ in range(max(1, args.rounds))]
    base, filt = runs[-1]
    base, filt = ({**base, "us_per_block": median(b["us_per_block"] for b, _ in runs)},
                  {**filt, "us_per_block": median(f["us_per_block"] for _, f in runs),
                   "counting_us_per_block": median(f["counting_us_per_block"] for _, f in runs)})
    ratios = [f["us_per_block"] / b["us_per_block"] for b, f in runs]
    per_block = filt["tracker_bytes"] / max(1, filt["tracked"])
    figures = {"blocks_per_request": args.blocks, "max_tracked": args.tracker,
               "prompt_blocks": filt["prompt_blocks"],
               "baseline_us_per_block": base["us_per_block"],
               "filter_us_per_block": filt["us_per_block"],
               "counting_us_per_block": filt["counting_us_per_block"],
               "tracker_bytes": filt["tracker_bytes"], "bytes_per_tracked_block": per_block,
               "bytes_at_default_tracker": per_block * MAX_TRACKED,
               "tracked_blocks": filt["tracked"], "baseline_hit_share": base["hit_share"],
               "filter_hit_share": filt["hit_share"], "rounds": len(runs),
               "filter_to_baseline": median(ratios),
               "load_average": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    print(f"{figures['prompt_blocks']:,} prompt blocks, {args.blocks} a request, GPU pool of "
          f"{args.gpu_blocks:,} blocks, tracker of {args.tracker:,} ({filt['tracked']:,} held)")
    print(f"every block cached (vLLM as shipped): {base['us_per_block']:.2f} us per prompt "
          f"block; {base['hit_share']:.1%} of blocks GPU hits")
    print(f"cached from the second request:       {filt['us_per_block']:.2f} us per prompt "
          f"block, of which counting the request {filt['counting_us_per_block']:.2f}; "
          f"{filt['hit_share']:.1%} of blocks GPU hits")
    print(f"filter / as shipped, per round: {', '.join(f'{r:.2f}' for r in ratios)} "
          f"(medians of {len(runs)} alternating rounds above)")
    print(f"the tracker: {filt['tracker_bytes'] / 2**20:.2f} MiB, {per_block:.0f} bytes per "
          f"tracked block (its hash included), {per_block * MAX_TRACKED / 2**20:.1f} MiB at the "
          f"default {MAX_TRACKED:,}; load average {figures['load_average']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
