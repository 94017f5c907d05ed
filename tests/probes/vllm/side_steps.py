"""Runs in a vLLM environment (the 0.33 side environment or the 0.32 CPU build): kvtier's
connector, resolved by vLLM's connector factory, sees a fixed sequence of scheduler steps built
from vLLM's own ``SchedulerOutput``, ``NewRequestData`` and ``CachedRequestData``, with vLLM's
real ``CPUOffloadingManager`` behind kvtier's manager wrapper; prints, as JSON, the step
records it made. The scheduler below the connector is a stub (building vLLM's needs a model):
it calls the manager where vLLM's offloading scheduler does (``prepare_load`` at admission,
``prepare_store`` in ``build_connector_meta``).

Usage: python side_steps.py
Not a test module: tests/probes/vllm/test_steps_real.py spawns it.
"""

import dataclasses
import json
import os
import sys
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def build(cls, **given):
    """A vLLM dataclass from the fields this scenario sets; other required fields None (the
    two vLLM versions differ in fields the connector never reads)."""
    for f in dataclasses.fields(cls):
        if f.name not in given and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            given[f.name] = None
    return cls(**given)


def key(i: int) -> bytes:
    return (1000 + i).to_bytes(8, "big") + b"\x00" * 4


def main() -> None:
    import vllm
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.collector.events import Origin
    from kvtier.collector.recorder import Recorder
    from kvtier.probes.vllm.recording import ManagerRecorder
    from kvtier.probes.vllm.spec import RecordingOffloadingManager
    from tests.probes.vllm.side_hooks import kvtier_parts

    cls = KVConnectorFactory.get_connector_class(KVTransferConfig(
        kv_connector="KvtierOffloadingConnector",
        kv_connector_module_path="kvtier.probes.vllm.connector", kv_role="kv_both",
        kv_connector_extra_config={"cpu_bytes_to_use": 1 << 20}))
    now, timer = [10.0], [500.0]
    recorder = Recorder(Origin("vllm", "steps", "steps-1"), clock=lambda: now[0])
    manager = RecordingOffloadingManager(CPUOffloadingManager(num_chunks=8),
                                         ManagerRecorder(recorder, chunk_bytes=4096, chunk_tokens=16))
    stored = manager.prepare_store([key(0)], ReqContext("old"))  # a chunk A will find on CPU
    manager.complete_store(stored.keys_to_store, ReqContext("old"))
    manager.observer.take_step_bytes()  # before the engine's first step
    stores = [[key(10), key(11)], [key(12)], [], [], [], []]  # what each step offloads

    def build_meta(output):
        keys = stores.pop(0)
        if keys:
            manager.prepare_store(keys, ReqContext("b"))
        return "meta"

    connector = object.__new__(cls)
    connector.connector_scheduler = SimpleNamespace(
        manager=manager, build_connector_meta=build_meta, take_events=lambda: (),
        update_state_after_alloc=lambda request, blocks, n: n and manager.prepare_load(
            [key(0)], ReqContext(request.request_id)))
    kvtier_parts(connector, recorder, {"kvtier_collector": "in-process"}, lambda: now[0],
                 timer=lambda: timer[0])

    def request(rid, prompt):
        return SimpleNamespace(request_id=rid, num_prompt_tokens=prompt, block_hashes=[])

    def new(rid, computed):
        return build(NewRequestData, req_id=rid, prompt_token_ids=None, mm_features=[],
                     block_ids=([],), num_computed_tokens=computed)

    def cached(*reqs, resumed=()):
        return build(CachedRequestData, req_ids=[r for r, _ in reqs], resumed_req_ids=set(resumed),
                     new_token_ids=[], all_token_ids={}, new_block_ids=[None] * len(reqs),
                     num_computed_tokens=[c for _, c in reqs], num_output_tokens=[0] * len(reqs))

    def step(t, new_reqs, cached_reqs, scheduled, ends_after_s, preempted=None):
        now[0] = t
        output = build(SchedulerOutput, scheduled_new_reqs=new_reqs,
                       scheduled_cached_reqs=cached_reqs, num_scheduled_tokens=scheduled,
                       total_num_scheduled_tokens=sum(scheduled.values()),
                       scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
                       finished_req_ids=set(), free_encoder_mm_hashes=[],
                       preempted_req_ids=preempted)
        assert connector.build_connector_meta(output) == "meta"
        return ends_after_s

    # step 0: A (40-token prompt, 16 from the CPU tier) and B (100 tokens, a first chunk of 32)
    connector.update_state_after_alloc(request("A", 40), None, 16)
    connector.update_state_after_alloc(request("B", 100), None, 0)
    ends = step(10.0, [new("A", 16), new("B", 0)], cached(), {"A": 24, "B": 32}, 0.05)
    timer[0] += ends
    connector.take_events()
    # step 1: A decodes over 40 tokens; B's second chunk (context 32, 68 tokens)
    ends = step(10.1, [], cached(("A", 40), ("B", 32)), {"A": 1, "B": 68}, 0.08)
    timer[0] += ends
    connector.take_events()
    # step 2: C is admitted with 16 tokens on the CPU tier and waits for their load; A and B
    # wait too (say the token budget went to nothing): only the load is recorded
    connector.update_state_after_alloc(request("C", 20), None, 16)
    step(10.2, [], cached(), {}, 0.0)
    timer[0] += 0.01
    connector.take_events()
    # step 3: nothing scheduled, nothing moved (vLLM steps while transfers drain): not recorded
    step(10.25, [], cached(), {}, 0.0)
    connector.take_events()
    # steps 4 and 5 overlap (async scheduling): 5 is scheduled before 4 ends. In 4, B was
    # preempted and A decodes; in 5, B resumes (16 tokens found again) and A decodes
    step(10.3, [], cached(("A", 41)), {"A": 1}, 0.0, preempted={"B"})
    timer[0] += 0.02
    connector.update_state_after_alloc(request("B", 100), None, 0)
    step(10.32, [], cached(("A", 42), ("B", 16), resumed={"B"}), {"A": 1, "B": 84}, 0.0)
    timer[0] += 0.03
    connector.take_events()  # step 4 ends
    timer[0] += 0.04
    connector.take_events()  # step 5 ends
    packed = recorder.take_packed()
    print("RESULT " + json.dumps({"vllm_version": vllm.__version__,
                                  "steps": [list(s) for s in packed.steps],
                                  "dropped": recorder.dropped_steps}))


if __name__ == "__main__":
    sys.exit(main())
