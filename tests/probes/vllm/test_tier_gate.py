"""The guardrail inside vLLM's scheduler, without vLLM: the state taken at step boundaries and
recorded as the engine's moves, the per-request load-or-recompute, the requests' records
(which tiers were paused at admission, what was recomputed instead), the load queue the
spec wrapper keeps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.collector.control import LinkCosts
from kvtier.collector.control_receiver import TierState
from kvtier.collector.events import Origin
from kvtier.collector.recorder import Recorder
from kvtier.probes.vllm.accounting import RequestTokenAccounting
from kvtier.probes.vllm.hook_settings import HookSettings
from kvtier.probes.vllm.recording import ManagerRecorder
from kvtier.probes.vllm.tier_gate import TierGate

CONFIGURED = "gpu+cpu:8388608"
PAUSED = TierState(frozenset({("loads", "cpu")}), command=7, reason="command")
# a load job costs 1 ms, a byte 1 ns, a token's prefill 0.1 ms
COSTS = LinkCosts(load_s_per_job=1e-3, load_s_per_byte=1e-9, recompute_s_per_token=1e-4)


class Receiver:
    state = TierState()


@pytest.fixture
def gate():
    recorder = Recorder(Origin("vllm", "i", "s"), clock=lambda: 5.0)
    receiver = Receiver()
    return TierGate(recorder, CONFIGURED, receiver, clock=lambda: 5.0), receiver, recorder


def test_the_state_is_taken_at_a_step_boundary_and_each_change_recorded(gate):
    gate, receiver, recorder = gate
    receiver.state = PAUSED
    assert gate.recompute_reason(512, 0, 0, 0, 1 << 20) is None  # not before the boundary
    assert gate.step() and not gate.step()  # one change, taken once
    assert gate.tier_config == "gpu+cpu:8388608;paused=loads:cpu"
    assert gate.recompute_reason(512, 0, 0, 0, 1 << 20) == "paused"
    receiver.state = TierState(reason="lease_expired")
    gate.step()
    moves = recorder.take_events().tier_moves.to_pylist()
    assert [(m["action"], m["direction"], m["tier"], m["actor"], m["reason"], m["command"],
             m["tier_config_id"]) for m in moves] == [
        ("pause", "loads", "cpu", "engine", "command", 7, "gpu+cpu:8388608;paused=loads:cpu"),
        ("resume", "loads", "cpu", "engine", "lease_expired", None, CONFIGURED)]
    assert gate.tier_config == CONFIGURED and gate.fallbacks == {"paused": 1}


def test_paused_cold_loads_recompute_only_prefixes_a_cold_block_is_part_of(gate):
    gate, receiver, _ = gate
    receiver.state = TierState(frozenset({("loads", "cold")}), reason="command")
    gate.step()
    assert gate.recompute_reason(512, 0, 0, 0, 1 << 20) is None
    assert gate.recompute_reason(512, 64, 0, 0, 1 << 20) == "paused"
    assert not gate.stores_paused


def test_in_act_a_load_waiting_longer_than_its_recompute_is_recomputed(gate):
    gate, receiver, _ = gate
    receiver.state = TierState(act=True, costs=COSTS, reason="command")
    gate.step()
    # 512 tokens recompute in 51.2 ms; a 1 MiB load alone waits 2 ms: it loads
    assert gate.recompute_reason(512, 0, 0, 0, 1 << 20) is None
    # behind 60 jobs and 40 MiB it would wait 61 ms + 42 ms: recomputed
    assert gate.recompute_reason(512, 0, 60, 40 << 20, 1 << 20) == "queue"
    assert gate.fallbacks == {"queue": 1}
    receiver.state = replace(receiver.state, act=False)  # observe: the costs are not used
    gate.step()
    assert gate.recompute_reason(512, 0, 60, 40 << 20, 1 << 20) is None


def test_stores_pause_with_the_cpu_tiers_stores(gate):
    gate, receiver, _ = gate
    receiver.state = TierState(frozenset({("stores", "cpu")}), reason="command")
    gate.step()
    assert gate.stores_paused and gate.recompute_reason(512, 0, 0, 0, 1 << 20) is None


def test_without_a_channel_the_gate_never_moves():
    recorder = Recorder(Origin("vllm", "i", "s"))
    gate = TierGate(recorder, CONFIGURED)
    assert not gate.step() and gate.recompute_reason(512, 64, 99, 1 << 30, 1 << 20) is None
    assert recorder.take_packed() is None


def test_a_request_records_its_fallback_and_the_tiers_paused_at_its_admission():
    recorder = Recorder(Origin("vllm", "i", "s"), clock=lambda: 10.0)
    accounting = RequestTokenAccounting(recorder, 32, clock=lambda: 10.0)
    settings = HookSettings(tier_config=CONFIGURED)

    class Req:
        num_output_tokens = 1

    accounting.matched("r1", arrival_s=9.0, prompt_tokens=640, gpu_tokens=64, sources={},
                       fallback=("paused", 512))
    accounting.admitted(Req(), "r1", 0, [1, 2], "gpu+cpu:8388608;paused=loads:cpu")
    tags = settings.tags({}, accounting.tier_config("r1"))
    accounting.finished("r1", status="FINISHED_LENGTH_CAPPED", output_tokens=1, tags=tags)
    (record,) = recorder.take_events().requests.to_pylist()
    assert (record["fallback_reason"], record["fallback_tokens"], record["recomputed_tokens"],
            record["tier_config_id"]) == ("paused", 512, 576, "gpu+cpu:8388608;paused=loads:cpu")
    assert settings.tags({"tier_config_id": "client's"}, "x")["tier_config_id"] == "client's"


def test_the_spec_wrapper_keeps_the_load_jobs_in_flight():
    observer = ManagerRecorder(Recorder(Origin("vllm", "i", "s")), chunk_bytes=1024, chunk_tokens=32)
    observer.prepared_load([b"a" * 8, b"b" * 8], None, "r1")
    observer.prepared_load([b"c" * 8], None, "r2")
    assert observer.load_queue() == (2, 3 * 1024)
    observer.completed_load([b"a" * 8, b"b" * 8], "r1")
    assert observer.load_queue() == (1, 1024)
    observer.request_finished("r2")  # a load that never completed is not queued forever
    assert observer.load_queue() == (0, 0)


def test_the_control_settings_come_from_the_extra_config(tmp_path):
    token = tmp_path / "token"
    token.write_text("t" * 32 + "\n")
    settings = HookSettings.from_extra_config({"cpu_bytes_to_use": 1 << 20,
                                               "kvtier_control_token_file": str(token),
                                               "kvtier_control_lease_s": 7})
    receiver = settings.control.receiver("node-1")
    assert (receiver.token, receiver.lease_s, receiver.endpoint) == (b"t" * 32, 7.0, "tcp://127.0.0.1:5571")
    assert HookSettings.from_extra_config({}).control is None
    for bad, message in (({"kvtier_control_token": "short"}, "at least 16 bytes"),
                         ({"kvtier_control_token_file": str(tmp_path / "none")}, "No such file"),
                         ({"kvtier_control_token": "t" * 20, "kvtier_control": "nowhere"},
                          "ZMQ endpoint"),
                         ({"kvtier_control_token": "t" * 20, "kvtier_control_lease_s": 0},
                          "kvtier_control_lease_s")):
        with pytest.raises(ValueError, match=message):
            HookSettings.from_extra_config(bad)
