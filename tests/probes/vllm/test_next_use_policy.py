"""The in-engine learned policy (standard library only) decides as its replay twin does.

The simulator's vLLM flow drives the twin (``policy/learn/nextuse_vllm.py``) over synthetic
agentic traffic; every call it makes is replayed into the plug-in's state, and every
eviction must pick the same blocks in the same order. The serving-engine check is in
``test_next_use_engine.py``.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from policy.learn.deploy import deployment
from policy.learn.nextuse_fit import fit_next_use
from policy.learn.nextuse import Readout
from policy.learn.nextuse_vllm import VllmNextUseTier, signals_of
from policy.sim.config import SimConfig
from policy.sim.simulator import Simulator
from probes.vllm import next_use_policy
from tests.policy.learn import traffic


class Logged(VllmNextUseTier):
    """The twin, writing down each call the flow makes."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.calls: list = []

    def start(self, signals):
        self.calls.append(("start", signals))
        super().start(signals)

    def touch(self, key, info=None):
        self.calls.append(("used", key, info.position, False))
        super().touch(key, info)

    def insert(self, key, info=None):
        self.calls.append(("used", key, info.position, True))
        return super().insert(key, info)

    def evict(self, n, protected=()):
        victims = super().evict(n, protected)
        self.calls.append(("evict", n, tuple(protected), None if victims is None else tuple(victims)))
        return victims

    def finish(self):
        super().finish()  # its own touches (GPU hits the tier holds) come first
        self.calls.append(("finish",))


def replay_twin(records, readout, model, gpu_blocks=40, cpu_blocks=120):
    twin = Logged(cpu_blocks, model, readout)
    simulator = Simulator(SimConfig(gpu_blocks, cpu_blocks, semantics="vllm",
                                    default_block_tokens=16), cpu_tier=twin)
    for i, record in enumerate(records):
        twin.observe_request(i, record, record.block_hashes)
        simulator.serve(record)
    return twin


@pytest.mark.parametrize("readout", [Readout("next_use", last_block_dead=True),
                                     Readout("reuse_within", horizon_s=100.0)])
def test_the_plug_in_state_evicts_as_the_replay_twin(readout):
    records = [dataclasses.replace(r, block_size_tokens=16,
                                   prompt_tokens=len(r.block_hashes) * 16 + 1)
               for r in traffic.agentic(sessions=30, seed=8, block_tokens=16)]
    model = fit_next_use(records[:len(records) // 2])
    twin = replay_twin(records, readout, model)
    next_use_policy.configure(json.loads(json.dumps(deployment(model, readout))))
    state = next_use_policy.NextUseState(next_use_policy._model())
    evictions, req = 0, None
    for call in twin.calls:
        if call[0] == "start":
            req = f"r{state._seq + 1}"
            state.request(req, {"kvtier": call[1]})
        elif call[0] == "used":
            state.used(state._requests[req], call[1], call[2], call[3])
        elif call[0] == "finish":
            state.finished(req)
        else:
            _, n, protected, expected = call
            busy = set(protected)
            got = state.order(n, lambda h: h in busy)
            got = tuple(got) if len(got) >= n else None
            assert got == expected
            for h in got or ():
                state.forget(h)
            evictions += 1
    assert evictions > 50  # the tier was under pressure the whole time
    next_use_policy.configure(None)


def test_signals_carry_what_a_gateway_knows():
    (record,) = traffic.agentic(sessions=1, seed=0)[:1]
    signals = signals_of(record)
    assert signals["session_id"] == record.session_id and signals["arrival_s"] == 0.0
    assert signals["stop_reason"] in ("tool_use", "end_turn")


def test_a_block_no_request_announced_goes_first():
    state = next_use_policy.NextUseState(None)
    request = state.request("a", {"kvtier": {"arrival_s": 1.0}})
    state.used(request, 1, 0, True)
    state.used(request, 2, 1, True)
    state.finished("a")
    state.orphan(3)  # stored without its request (a store racing a cache reset)
    assert state.order(3, lambda h: False) == [3, 2, 1]
    state.forget(3)
    assert state.order(1, lambda h: False) == [2]
