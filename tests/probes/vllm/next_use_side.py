"""Run under a vLLM environment: vLLM's real CPUOffloadingManager with kvtier's next-use policy.

Prints ``RESULT {json}``: the vLLM version and the chunks evicted by each store. Sessions
arrive as a gateway would tag them (``kv_transfer_params["kvtier"]``); there is no model, so
the order is the policy's rules alone: a conversation that moved on without its blocks goes
first, deepest block first, then the least recently used request's.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext

BLOCK = 16


def main() -> None:
    import vllm
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.probes.vllm import next_use_policy

    next_use_policy.configure(None)
    manager = CPUOffloadingManager(num_chunks=4, cache_policy="KvtierNextUsePolicy",
                                   cache_policy_module_path="kvtier.probes.vllm.next_use_policy")
    key = lambda i: make_offload_key((1000 + i).to_bytes(32, "big"), 0)
    evicted = []

    def request(name, session, t, blocks):
        ctx = ReqContext(name, kv_transfer_params={"kvtier": {
            "session_id": session, "arrival_s": t, "block_tokens": BLOCK}})
        keys = [key(i) for i in blocks]
        for position, k in enumerate(keys):
            ctx.set_offload_key_position(k, (position + 1) * BLOCK)
        with getattr(manager, "lock", None) or nullcontext():  # 0.32 managers have no lock
            out = manager.prepare_store(keys, ctx)
            evicted.append([int.from_bytes(k[:-4], "big") - 1000 for k in out.evicted_keys])
            manager.complete_store(out.keys_to_store, ctx)
            manager.on_request_finished(ctx)

    request("a", "s1", 1.0, [0, 1])   # s1's first turn
    request("b", "s2", 2.0, [2])
    request("c", "s1", 3.0, [3])      # s1 moved on without blocks 0 and 1 (a new context)
    request("d", "s3", 4.0, [4])      # full: s1's dead blocks go first, deepest first
    request("e", "s3", 5.0, [4, 5])   # then the other one
    request("f", "s4", 6.0, [6, 7])   # then the least recently used requests': b's, c's
    print("RESULT " + json.dumps({"vllm_version": vllm.__version__, "evicted": evicted}))


if __name__ == "__main__":
    sys.exit(main())
