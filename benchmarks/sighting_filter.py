"""The sighting filter inside vLLM: what admitting a chunk on its second offer costs vLLM's CPU
offloading manager, in memory and per offered block, beside the same manager admitting every
chunk, on the same offers in the same run.

Run: ``python benchmarks/sighting_filter.py --json`` (needs a vLLM environment,
``$KVTIER_VLLM_PYTHON`` or ``.venv-vllm``; about a minute; ``--smoke``: tiny inputs, to check it
runs). kvtier deploys the filter as vLLM's own ``store_threshold`` (the tracker is vLLM's
``OrderedDict`` of ``max_tracker_size`` chunk keys). Requests of ``--blocks`` chunks, a
``--repeat`` share of them a prompt sent before (a conversation's history re-offered), go through
vLLM's real ``CPUOffloadingManager`` (``prepare_store``, ``complete_store``, the request's
finish) with ``store_threshold`` 0 (the baseline) and 2, until more distinct chunks were offered
than the tracker holds, so it is full. Printed: microseconds per offered block for each, and of
them the tracker's own update; the bytes each manager holds (tracemalloc) and the bytes freed
when the tracker is emptied (its entries and the keys only it keeps), per tracked chunk and for
a tracker of vLLM's default 64,000 chunks. Stores the filter skips save copies a real engine
makes; here they cost only the manager's bookkeeping.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.vllm_side import (add_traffic_arguments, prompts, report,  # noqa: E402
                                  run_inside, traffic_options, vllm_python)

ENGINE_ENV = "KVTIER_VLLM_PYTHON"  # the vLLM environment the manager runs in
# the keys of the --json object (every run prints them; tests/test_benchmarks.py checks)
FIGURES = ("blocks_per_request", "max_tracker_size", "offered_blocks", "baseline_us_per_block",
           "filter_us_per_block", "tracker_us_per_block", "baseline_held_bytes",
           "filter_held_bytes", "tracker_bytes", "bytes_per_tracked_chunk",
           "bytes_at_default_tracker", "tracked_chunks", "stores_skipped_share", "load_average")
SMOKE = {"tracker": 500, "requests": 300, "chunks": 256}  # --smoke's sizes
DEFAULT_TRACKER = 64_000  # vLLM's max_tracker_size


def _drive(threshold: int, tracker: int, chunks: int, requests: int, blocks: int,
           repeat: float) -> dict:
    """In a vLLM process: the offers through one manager timed (and the tracker's own update,
    vLLM's ``_record_accesses``), then through a fresh one traced (tracemalloc slows what it
    traces): the bytes it holds, and the bytes freed when its tracker is emptied."""
    import gc
    import tracemalloc

    sent = list(prompts(requests, blocks, repeat))
    timed = _offers(_manager(threshold, tracker, chunks), sent, timed=True)
    manager = _manager(threshold, tracker, chunks)
    tracemalloc.start()
    _offers(manager, sent, timed=False)
    gc.collect()
    held, tracked = tracemalloc.get_traced_memory()[0], 0
    if manager.counts is not None:
        tracked = len(manager.counts)
        manager.counts.clear()
        gc.collect()
    freed = held - tracemalloc.get_traced_memory()[0]
    return {**timed, "held_bytes": held, "tracker_bytes": freed, "tracked": tracked}


def _manager(threshold: int, tracker: int, chunks: int):
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    manager = CPUOffloadingManager(num_chunks=chunks, store_threshold=threshold,
                                   max_tracker_size=tracker)
    manager.tracker_s = 0.0
    if manager.counts is not None:  # time the tracker's own update
        record = manager._record_accesses

        def timed_record(keys):
            began = time.perf_counter()
            record(keys)
            manager.tracker_s += time.perf_counter() - began

        manager._record_accesses = timed_record
    return manager


def _offers(manager, prompts, timed: bool) -> dict:
    """Every request's chunks (keys made per request, as the scheduler makes them) offered,
    stored and the request finished."""
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key

    lock = getattr(manager, "lock", None) or nullcontext()
    elapsed, offered, skipped = 0.0, 0, 0
    for i, prompt in enumerate(prompts):
        ctx = ReqContext(f"r{i}")
        offer = [make_offload_key(b.to_bytes(32, "big"), 0) for b in prompt]
        began = time.perf_counter()
        with lock:
            out = manager.prepare_store(offer, ctx)
            if out is not None:
                manager.complete_store(out.keys_to_store, ctx)
            manager.on_request_finished(ctx)
        elapsed += time.perf_counter() - began
        offered += len(offer)
        skipped += manager.stores_skipped_in_current_batch
        manager.stores_skipped_in_current_batch = 0
    return {"us_per_block": elapsed / max(1, offered) * 1e6, "offered_blocks": offered,
            "tracker_us_per_block": manager.tracker_s / max(1, offered) * 1e6,
            "skipped": skipped}


def _inside(python: str, threshold: int, args) -> dict:
    return run_inside(python, __file__, [
        "--inside", str(threshold), "--tracker", str(args.tracker), "--chunks", str(args.chunks),
        *traffic_options(args)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracker", type=int, default=DEFAULT_TRACKER,
                        help="max_tracker_size: chunks the filter's tracker holds")
    parser.add_argument("--chunks", type=int, default=8192, help="CPU tier size in chunks")
    add_traffic_arguments(parser, "chunks")  # --inside: the threshold
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.inside:
        report(_drive(int(args.inside), args.tracker, args.chunks, args.requests, args.blocks,
                      args.repeat))
        return 0
    python = vllm_python()
    if python is None:
        return 2
    base, filt = (_inside(python, t, args) for t in (0, 2))
    per_chunk = filt["tracker_bytes"] / max(1, filt["tracked"])
    figures = {"blocks_per_request": args.blocks, "max_tracker_size": args.tracker,
               "offered_blocks": filt["offered_blocks"],
               "baseline_us_per_block": base["us_per_block"],
               "filter_us_per_block": filt["us_per_block"],
               "tracker_us_per_block": filt["tracker_us_per_block"],
               "baseline_held_bytes": base["held_bytes"], "filter_held_bytes": filt["held_bytes"],
               "tracker_bytes": filt["tracker_bytes"], "bytes_per_tracked_chunk": per_chunk,
               "bytes_at_default_tracker": per_chunk * DEFAULT_TRACKER,
               "tracked_chunks": filt["tracked"],
               "stores_skipped_share": filt["skipped"] / max(1, filt["offered_blocks"]),
               "load_average": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    print(f"{figures['offered_blocks']:,} blocks offered, {args.blocks} a request, tracker of "
          f"{args.tracker:,} chunks ({filt['tracked']:,} held), CPU tier {args.chunks:,} chunks")
    print(f"admit every chunk (store_threshold 0): {base['us_per_block']:.2f} us per offered "
          f"block, the manager holding {base['held_bytes'] / 2**20:.2f} MiB")
    print(f"admit on the second offer (2):         {filt['us_per_block']:.2f} us per offered "
          f"block, of which the tracker {filt['tracker_us_per_block']:.2f}; "
          f"{figures['stores_skipped_share']:.0%} of offers skipped; the manager holding "
          f"{filt['held_bytes'] / 2**20:.2f} MiB")
    print(f"the tracker: {filt['tracker_bytes'] / 2**20:.2f} MiB, {per_chunk:.0f} bytes per "
          f"tracked chunk (its key included), {per_chunk * DEFAULT_TRACKER / 2**20:.1f} MiB at "
          f"vLLM's default {DEFAULT_TRACKER:,}; load average {figures['load_average']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
