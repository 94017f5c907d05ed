"""What vLLM's own CPU offloading counters count when its CPU tier is full of chunks in flight,
next to what kvtier's spec wrapper records: run inside a vLLM environment by side_hooks.py
(tests/probes/vllm/test_spec_real.py reads the result).

vLLM's ``CPUOffloadingManager.prepare_store`` observes the chunks a store asks for
(``vllm:kv_offload_cpu_allocation_size``) before it knows whether they can be allocated; a
store that cannot be (no evictable chunk) returns ``None``, the connector counts one
``vllm:kv_offload_allocation_failure`` and asks again at the next scheduler step.
"""

from __future__ import annotations

CHUNK_BYTES = 4096


def run_allocation_failure(key, drained) -> dict:
    """A 4-chunk CPU tier: 4 chunks stored and still in flight, then a store of 2 more that
    cannot be allocated, asked for at 3 steps; the 4 complete and the 2 are stored at the 4th.
    ``key(i)`` makes the i-th offload key; ``drained(recorder)`` reads a recorder's rows
    (side_hooks.py's, without pyarrow)."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.collector.events import Origin
    from kvtier.collector.recorder import Recorder
    from kvtier.probes.vllm.recording import ManagerRecorder
    from kvtier.probes.vllm.spec import RecordingOffloadingManager

    recorder = Recorder(Origin("vllm", "counters", "counters-1"))
    manager = RecordingOffloadingManager(CPUOffloadingManager(num_chunks=4),
                                         ManagerRecorder(recorder, chunk_bytes=CHUNK_BYTES))
    ctx = ReqContext("r1")
    manager.on_new_request(ctx)
    first = manager.prepare_store([key(i) for i in range(4)], ctx)  # in flight: not evictable
    refused = [manager.prepare_store([key(4), key(5)], ctx) is None for _ in range(3)]
    manager.complete_store(first.keys_to_store, ctx)
    second = manager.prepare_store([key(4), key(5)], ctx)
    manager.complete_store(second.keys_to_store, ctx)
    engine = manager.get_stats().reduce()  # what the connector hands vLLM's Prometheus logger
    stores = [r["size_bytes"] for r in drained(recorder)["rows"] if r["kind"] == "store"]
    return {"refused": refused,
            "asked_chunks": engine.get("vllm:kv_offload_cpu_allocation_size_sum"),
            "asks": engine.get("vllm:kv_offload_cpu_allocation_size_count"),
            "hooks_stores": len(stores), "hooks_stored_bytes": sum(stores),
            "chunks_stored": len(first.keys_to_store) + len(second.keys_to_store)}
