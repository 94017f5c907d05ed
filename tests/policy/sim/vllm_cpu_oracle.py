"""Runs in the vLLM side environment (see tests/probes/vllm/side_env.sh): replays block
streams through vLLM 0.33's own ``CPUOffloadingManager`` and prints each request's hits.

Input on stdin, a JSON list of cases ``{"capacity": N, "policy": "lru"|"arc",
"store_threshold": K, "requests": [[hash, ...], ...]}``. Output: per case, a JSON list with
the number of leading blocks each request found (its CPU prefix hits).

Per request, in the engine's order for a CPU-only deployment: ``lookup`` until the first
miss, ``prepare_load`` + ``complete_load`` of the hits, ``prepare_store`` +
``complete_store`` of the blocks after them (the recomputed ones), ``on_request_finished``.
"""

import json
import sys

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager


def main() -> None:
    json.dump([replay(case) for case in json.load(sys.stdin)], sys.stdout)


def replay(spec: dict) -> list[int]:
    manager = CPUOffloadingManager(num_chunks=spec["capacity"], cache_policy=spec["policy"],
                                   store_threshold=spec.get("store_threshold", 0) or 1)
    hits_per_request = []
    for index, hashes in enumerate(spec["requests"]):
        context = ReqContext(req_id=f"r{index}")
        keys = [make_offload_key(h.to_bytes(8, "big"), 0) for h in hashes]
        for position, key in enumerate(keys):
            context.set_offload_key_position(key, position)
        manager.on_new_request(context)
        hits = 0
        for key in keys:
            if manager.lookup(key, context) is not LookupResult.HIT:
                break
            hits += 1
        if hits:
            manager.prepare_load(keys[:hits], context)
            manager.complete_load(keys[:hits], context)
        output = manager.prepare_store(keys[hits:], context)
        if output is not None and output.keys_to_store:
            manager.complete_store(output.keys_to_store, context)
        manager.on_request_finished(context)
        hits_per_request.append(hits)
    return hits_per_request


if __name__ == "__main__":
    main()
