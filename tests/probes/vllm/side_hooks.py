"""Runs in a vLLM environment (the official 0.33 wheel's side environment, or the 0.32 CPU
build): drives vLLM's real CPUOffloadingManager and TieringOffloadingManager (fs tier in a
temporary folder) through kvtier's spec wrappers, its cache policy and its connector, and
prints, as JSON, what vLLM did next to what kvtier recorded.

Like kvtier's plug-ins inside an engine, it needs no pyarrow: the recorders are drained with
``take_packed`` and the packed records read with numpy here.

Usage: python side_hooks.py FS_ROOT
Not a test module: tests/probes/vllm/test_spec_real.py spawns it.
"""

import json
import os
import sys
import time
from contextlib import nullcontext

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
from tests.probes.vllm import side_counters  # noqa: E402  (standard library only at import)
IN_PROCESS = {"kvtier_collector": "in-process"}  # this script drains the recorders itself


def locked(manager):
    return getattr(manager, "lock", None) or nullcontext()  # vLLM 0.32 managers have no lock


def drained(recorder):
    """The recorder's batch as row dicts (labels for enums, None for nulls), without pyarrow."""
    import numpy as np

    from kvtier.collector.events import Outcome, Tier
    from kvtier.collector.record_layout import DTYPE, NULL_BIT

    packed = recorder.take_packed()
    if packed is None:
        return {"rows": [], "requests": [], "origin": None, "rejected": 0}
    rows = []
    for rec in np.frombuffer(packed.records, dtype=DTYPE):
        nulls = int(rec["nulls"])

        def value(name, convert):
            return None if nulls & NULL_BIT[name] else convert(
                rec["request_key" if name == "request_id" else name])

        rows.append({
            "time_s": float(rec["time_s"]), "kind": Outcome(int(rec["kind"])).label,
            "block_hash": int(rec["block_hash"]),
            "request_id": value("request_id", lambda k: packed.request_names[int(k)]),
            "parent_hash": value("parent_hash", int), "position": value("position", int),
            "tokens": value("tokens", int), "size_bytes": value("size_bytes", int),
            "tier_from": value("tier_from", lambda c: Tier(int(c)).label),
            "tier_to": value("tier_to", lambda c: Tier(int(c)).label),
            "priority": value("priority", int), "latency_s": value("latency_s", float)})
    requests = [{f: getattr(r, f) for f in r.__dataclass_fields__} for r in packed.requests]
    return {"rows": rows, "requests": requests, "origin": packed.origin.source,
            "rejected": packed.rejected_calls}


def offload_config(extra, mode):
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig, OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    import dataclasses

    # 0.33 added max_model_len (0.32: name and dtype only)
    model_extra = ({"max_model_len": 4096} if "max_model_len" in
                   {f.name for f in dataclasses.fields(OffloadingModelConfig)} else {})
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(16, ("layer.0",), 0),), worker_kv_bytes_per_block=4096,
        enable_kv_cache_events=True, extra_config=extra, engine_id=f"kvtier-test-{mode}-{os.getpid()}",
        model=OffloadingModelConfig("kvtier/check", "float16",
                                    **model_extra),
        cache=OffloadingCacheConfig(16, 1),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True))


def key(i):
    from vllm.v1.kv_offload.base import make_offload_key

    return make_offload_key((1000 + i).to_bytes(32, "big"), 0)


def store(manager, keys, ctx, did):
    with locked(manager):
        out = manager.prepare_store(keys, ctx)
        did["evicted"] += [int.from_bytes(k[:-4], "big") for k in out.evicted_keys]
        manager.complete_store(out.keys_to_store, ctx)
        did["stored"] += [int.from_bytes(k[:-4], "big") for k in out.keys_to_store]


def load(manager, keys, ctx, did):
    with locked(manager):
        manager.prepare_load(keys, ctx)
        manager.complete_load(keys, ctx)
    did["loaded"] += [int.from_bytes(k[:-4], "big") for k in keys]


def wait_lookup(manager, k, ctx, want, rounds=400):
    from vllm.v1.kv_offload.base import ScheduleEndContext

    for _ in range(rounds):
        with locked(manager):
            result = manager.lookup(k, ctx)
            manager.on_schedule_end(ScheduleEndContext(set(), set()))
        if result.name == want:
            return result.name
        time.sleep(0.01)
    return result.name


def settle(manager, rounds=400):
    """Step until no transfer is in flight: the scheduler's per-step calls (both poll finished
    jobs; 0.32 polls only at the step end; take_events reports the tier's stores)."""
    from vllm.v1.kv_offload.base import ScheduleEndContext

    for _ in range(rounds):
        with locked(manager):
            manager.on_schedule_end(ScheduleEndContext(set(), set()))
            manager.take_events()
            if not manager.has_pending_work():
                return
        time.sleep(0.01)


def run(mode, fs_root):
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    from kvtier.probes.vllm.recorders import recorder_for

    extra = {"spec_module_path": "kvtier.probes.vllm.spec", "cpu_bytes_to_use": 4 * 4096,
             "eviction_policy": "lru", "kvtier_instance": "side-test", **IN_PROCESS}
    if mode == "cpu":
        extra["spec_name"] = "KvtierCPUOffloadingSpec"
    else:
        extra.update(spec_name="KvtierTieringOffloadingSpec",
                     secondary_tiers=[{"type": "fs", "root_dir": fs_root,
                                       "enable_kv_events": True}])
    spec = OffloadingSpecFactory.create_spec(offload_config(extra, mode))
    manager = spec.get_manager()
    did = {"stored": [], "evicted": [], "loaded": [], "lookups": {}, "class": type(manager).__name__,
           # vLLM's own tokens per offloaded chunk (its scheduler's tokens_per_chunk)
           "chunk_tokens": spec.tokens_per_block[0] * spec.blocks_per_chunk}
    ctx = ReqContext("req-1")
    with locked(manager):
        manager.on_new_request(ctx)
    store(manager, [key(i) for i in range(4)], ctx, did)            # fills the 4 chunks
    if mode == "tiering":  # let the cascade to the fs tier finish before evicting
        settle(manager)
    store(manager, [key(4), key(5)], ctx, did)                       # evicts the 2 LRU chunks
    did["lookups"]["k5"] = wait_lookup(manager, key(5), ctx, "HIT")
    load(manager, [key(5)], ctx, did)                                # CPU -> GPU
    if mode == "cpu":
        did["lookups"]["k9"] = wait_lookup(manager, key(9), ctx, "MISS")
    else:  # key 0 was evicted from CPU but lives in the fs tier: a cold promotion
        did["lookups"]["k0"] = wait_lookup(manager, key(0), ctx, "HIT")
        load(manager, [key(0)], ctx, did)
    settle(manager)
    with locked(manager):
        manager.on_request_finished(ctx)
    manager.shutdown()
    out = drained(recorder_for(spec.config.engine_id))  # the one the plug-ins made
    return {"did": did, "rows": out["rows"], "origin": out["origin"]}


def main():
    results = {mode: run(mode, sys.argv[1]) for mode in ("cpu", "tiering")}
    results["policy"] = run_policy()
    results["connector"] = run_connector()
    results["tier_config"] = run_tier_config()
    results["exact"] = run_exact()
    results["allocation_failure"] = side_counters.run_allocation_failure(key, drained)
    import vllm

    results["vllm_version"] = vllm.__version__
    print("RESULT " + json.dumps(results))




def run_policy():
    """vLLM's real CPUOffloadingManager with kvtier's scored policy: odd hashes score low."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.probes.vllm import cache_policy

    cache_policy.configure(lambda h: 0.1 if h % 2 else 0.9, threshold=0.5)
    manager = CPUOffloadingManager(num_chunks=4, cache_policy="KvtierScoredLRUPolicy",
                                   cache_policy_module_path="kvtier.probes.vllm.cache_policy")
    did = {"stored": [], "evicted": [], "loaded": []}
    ctx = ReqContext("req-p")
    store(manager, [key(0), key(1), key(2), key(3)], ctx, did)   # 1001, 1003 score low
    store(manager, [key(4)], ctx, did)                           # evicts 1001, not LRU 1000
    store(manager, [key(5), key(6)], ctx, did)                   # evicts 1003, then LRU 1000
    cache_policy.configure(None)
    return {"did": did}


def kvtier_parts(connector, recorder, extra: dict, clock, timer=None) -> None:
    """The connector's own scheduler-side set-up (``_kvtier_attach``, which ``__init__``
    calls), for a connector built without vLLM's config (``object.__new__``): 16-token blocks,
    the model "tiny", no control channel; ``timer`` for the step records' monotonic clock."""
    import time

    from kvtier.probes.vllm.hook_settings import HookSettings

    connector._kvtier_attach(HookSettings.from_extra_config(extra), extra, recorder, 16,
                             model="tiny", clock=clock, timer=timer or time.perf_counter)


def run_connector():
    """vLLM's connector factory resolves kvtier's connector; its scheduler-side overrides
    record the token split, the finish, the latencies and the client's tags (the scheduler
    below the connector is a stub: building vLLM's needs a model). One request is looked up
    twice (the first allocation failed), admitted, emits a token per step, and finishes."""
    from types import SimpleNamespace

    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    from kvtier.collector.events import Origin
    from kvtier.collector.recorder import Recorder

    cls = KVConnectorFactory.get_connector_class(KVTransferConfig(
        kv_connector="KvtierOffloadingConnector", kv_connector_module_path="kvtier.probes.vllm.connector",
        kv_role="kv_both", kv_connector_extra_config={"cpu_bytes_to_use": 1 << 20}))
    connector = object.__new__(cls)
    connector._bounding_group_ids = ()
    connector.connector_scheduler = SimpleNamespace(
        get_num_new_matched_tokens=lambda request, n, max_num_new_tokens=None: (32, True),
        get_external_cache_hit_sources=lambda request, n: {CacheHitSource.HOST: 16,
                                                           CacheHitSource.DISK: 16},
        update_state_after_alloc=lambda request, blocks, n: None,
        take_events=lambda: (), request_finished=lambda request: (False, None))
    now = [1000.0]
    recorder = Recorder(Origin("vllm", "conn", "conn-1"), clock=lambda: now[0])
    kvtier_parts(connector, recorder, IN_PROCESS, lambda: now[0])
    ids = SimpleNamespace(request_id="chatcmpl-c", external_req_id=None)
    InputProcessor.assign_request_id(ids)  # vLLM's frontend names the engine-core request
    request = SimpleNamespace(
        request_id=ids.request_id, arrival_time=999.5, num_prompt_tokens=100, num_output_tokens=0,
        block_hashes=[(7000 + i).to_bytes(32, "big") for i in range(6)],
        status=SimpleNamespace(name="FINISHED_STOPPED"), stop_reason=2, session_id=None,
        kv_transfer_params={"kvtier": {"session_id": "chat-7", "turn": 3, "request_type": 5}})
    answer = connector.get_num_new_matched_tokens(request, 32)  # allocation fails: asked again
    now[0] = 1000.1
    connector.get_num_new_matched_tokens(request, 32)
    connector.update_state_after_alloc(request, None, 32)
    connector.update_state_after_alloc(request, None, 0)  # vLLM again, once the load is done
    for tokens, t in ((0, 1000.2), (1, 1000.25), (2, 1000.3), (3, 1000.35)):
        now[0] = t
        request.num_output_tokens = tokens
        connector.take_events()
    now[0] = 1000.45
    request.num_output_tokens = 4
    connector.request_finished_all_groups(request, ([],))
    out = drained(recorder)
    return {"subclass": issubclass(cls, OffloadingConnector), "answer": list(answer),
            "rows": out["rows"], "requests": out["requests"], "internal_id": ids.request_id}


def run_tier_config():
    """Each request record carries the tier configuration: derived from the offload settings
    vLLM's config holds (``--kv-offloading-size 2`` gives ``cpu_bytes_to_use`` as a float),
    or ``kvtier_tier_config``; a client's ``kv_transfer_params`` overrides either."""
    from types import SimpleNamespace

    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from kvtier.collector.events import Origin
    from kvtier.collector.recorder import Recorder

    results = {}
    for name, extra in (("derived", {"cpu_bytes_to_use": 2.0 * (1 << 30)}),
                        ("named", {"cpu_bytes_to_use": 1 << 30, "kvtier_tier_config": "canary-b"})):
        transfer = KVTransferConfig(
            kv_connector="KvtierOffloadingConnector", kv_role="kv_both",
            kv_connector_module_path="kvtier.probes.vllm.connector",
            kv_connector_extra_config={**extra, **IN_PROCESS})
        connector = object.__new__(KVConnectorFactory.get_connector_class(transfer))
        connector._bounding_group_ids = ()
        connector.connector_scheduler = SimpleNamespace(
            get_num_new_matched_tokens=lambda request, n, max_num_new_tokens=None: (0, False),
            get_external_cache_hit_sources=lambda request, n: {},
            update_state_after_alloc=lambda request, blocks, n: None,
            take_events=lambda: (), request_finished=lambda request: (False, None))
        recorder = Recorder(Origin("vllm", "conn", f"conn-{name}"), clock=lambda: 5.0)
        kvtier_parts(connector, recorder, transfer.kv_connector_extra_config, lambda: 5.0)
        for request_id, params in (("plain", None),
                                   ("client", {"kvtier": {"tier_config_id": "gpu-only"}})):
            request = SimpleNamespace(
                request_id=request_id, arrival_time=4.0, num_prompt_tokens=32,
                num_output_tokens=0, block_hashes=[], status=SimpleNamespace(name="FINISHED_STOPPED"),
                stop_reason=None, session_id=None, kv_transfer_params=params)
            connector.get_num_new_matched_tokens(request, 0)
            connector.update_state_after_alloc(request, None, 0)
            request.num_output_tokens = 1
            connector.request_finished_all_groups(request, ([],))
        results[name] = {r["request_id"]: r["tier_config_id"]
                         for r in drained(recorder)["requests"]}
    return results


def run_exact():
    """A fixed call sequence on vLLM's real CPUOffloadingManager (4 chunks, events on) through
    the wrapper, with a clock the script sets: every recorded field is determined."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.collector.events import Origin
    from kvtier.collector.recorder import Recorder
    from kvtier.probes.vllm.recording import ManagerRecorder
    from kvtier.probes.vllm.spec import RecordingOffloadingManager

    now = [100.0]
    clock = lambda: now[0]
    recorder = Recorder(Origin("vllm", "exact", "exact-1"), clock=clock)
    manager = RecordingOffloadingManager(
        CPUOffloadingManager(num_chunks=4, enable_events=True),
        ManagerRecorder(recorder, chunk_bytes=4096, chunk_tokens=32, clock=clock))
    r1, r2 = ReqContext("r1"), ReqContext("r2")
    manager.on_new_request(r1)
    manager.on_new_request(r2)

    def at(t, call, *args):
        now[0] = t
        return call(*args)

    out = at(100.0, manager.prepare_store, [key(i) for i in range(4)], r1)
    at(100.5, manager.complete_store, out.keys_to_store, r1)
    for _ in range(2):  # a waiting request: the miss is reported once
        at(101.0, manager.lookup, key(9), r1)
    at(101.0, manager.lookup, key(0), r1)                       # a hit: nothing recorded
    at(101.5, manager.prepare_load, iter([key(0), key(1)]), r1)  # an iterator, as vLLM may pass
    at(101.75, manager.complete_load, [key(0), key(1)], r1)
    at(102.0, manager.prepare_store, [key(4), key(5)], r2)       # evicts two chunks
    at(102.5, manager.complete_store, [key(4)], r2)
    at(102.5, manager.complete_store, [key(5)], r2, False)      # a failed store: a drop
    at(103.0, manager.prepare_store, [key(6)], r2)              # evicts one more
    at(103.5, manager.prepare_store, [key(7)], r2)
    at(104.0, manager.complete_store, [key(7), key(8), key(6)], r2)  # 8 never prepared
    at(104.0, manager.prepare_store, [key(4)], r1)              # already stored: nothing new
    at(104.5, manager.take_events)                              # CPU removals already seen
    at(105.0, manager.on_request_finished, r1)
    at(105.0, manager.lookup, key(9), r1)                       # a new admission: again
    batch = drained(recorder)
    # Without events (vLLM's default), nothing would ever clear a remembered eviction.
    quiet = RecordingOffloadingManager(CPUOffloadingManager(num_chunks=1),
                                       ManagerRecorder(recorder, chunk_bytes=4096, clock=clock))
    for i in range(3):
        quiet.complete_store(quiet.prepare_store([key(i)], r1).keys_to_store, r1)
    evicted = [r["block_hash"] for r in drained(recorder)["rows"] if r["kind"] == "evict"]
    return {"rows": batch["rows"], "dropped": recorder.dropped_events,
            "rejections": batch["rejected"], "quiet_evicted": evicted,
            "quiet_remembered": len(quiet.observer._evictions_seen)}


if __name__ == "__main__":
    main()
