"""The connector's per-request accounting without vLLM: the scheduler's calls, narrated."""

from __future__ import annotations

import pytest

from kvtier.collector.events import Origin
from kvtier.collector.recorder import Recorder
from kvtier.probes.vllm.accounting import RequestTokenAccounting, client_request_id, request_tags


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Req:
    """The attributes of a vLLM ``Request`` the accounting reads."""

    def __init__(self):
        self.num_output_tokens = 0


@pytest.fixture
def acc():
    clock = Clock()
    recorder = Recorder(Origin("vllm", "i", "s"), clock=clock)
    return RequestTokenAccounting(recorder, 16, model="m", clock=clock), recorder, clock


def drained(recorder):
    batch = recorder.take_events()
    return batch.block_events.to_pylist(), batch.requests.to_pylist()


def test_a_request_looked_up_twice_is_counted_once_at_admission(acc):
    accounting, recorder, clock = acc
    accounting.matched("r1", arrival_s=99.0, prompt_tokens=80, gpu_tokens=32, sources={"host": 16})
    accounting.matched("r1", arrival_s=99.0, prompt_tokens=80, gpu_tokens=32,  # no blocks free
                       sources={"host": 8, "disk": 8})
    request = Req()
    accounting.admitted(request, "r1", 16, [1, 2, 3, 4, 5])
    accounting.admitted(request, "r1", 0, [1, 2, 3, 4, 5])  # again once its CPU load is done
    clock.now = 100.5
    request.num_output_tokens = 1
    accounting.step(lambda r: r.num_output_tokens)
    clock.now = 101.0
    accounting.finished("r1", status="FINISHED_LENGTH_CAPPED", output_tokens=3,
                        tags={"session_id": "s1"})
    events, (req,) = drained(recorder)
    assert [(e["kind"], e["block_hash"], e["parent_hash"], e["position"]) for e in events] == [
        ("gpu_hit", 1, None, 0), ("gpu_hit", 2, 1, 1)]
    assert {k: req[k] for k in ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens",
                                "recomputed_tokens", "finish_status", "session_id", "model")} == {
        "gpu_hit_tokens": 32, "cpu_promotion_tokens": 8, "cold_promotion_tokens": 8,
        "recomputed_tokens": 32, "finish_status": "length", "session_id": "s1", "model": "m"}
    assert (req["ttft_s"], req["itl_s"], req["e2e_latency_s"]) == (1.5, 0.25, 2.0)


def test_a_request_never_admitted_leaves_no_record(acc):
    accounting, recorder, _ = acc
    accounting.matched("r2", arrival_s=99.0, prompt_tokens=80, gpu_tokens=0, sources={})
    accounting.finished("r2", status="FINISHED_ABORTED", output_tokens=0)  # aborted while waiting
    accounting.finished("never-seen", status="FINISHED_STOPPED")
    assert recorder.take_events() is None


@pytest.mark.parametrize("status, stop_reason, expected", [
    ("FINISHED_STOPPED", None, ("stopped", None)),        # end of sequence
    ("FINISHED_STOPPED", 13, ("stopped", "13")),           # a stop token id
    ("FINISHED_ABORTED", None, ("aborted", None)),         # a client abort, or a stop string
    ("FINISHED_IGNORED", None, ("length", None)),          # prompt too long: the API says length
    ("FINISHED_ERROR", None, ("error", None)),
    ("FINISHED_REPETITION", None, ("stopped", "repetition")),
    ("SOMETHING_NEW", None, (None, None)),                 # a future status: left unknown
])
def test_finish_status_and_stop_reason_follow_vllms_request_status(acc, status, stop_reason, expected):
    accounting, recorder, _ = acc
    accounting.matched("r", arrival_s=99.0, prompt_tokens=20, gpu_tokens=0, sources={})
    accounting.admitted(Req(), "r", 0, [])
    accounting.finished("r", status=status, stop_reason=stop_reason, output_tokens=1)
    _, (req,) = drained(recorder)
    assert (req["finish_status"], req["stop_reason"]) == expected
    assert req["itl_s"] is None and req["ttft_s"] == 1.0  # one token, in the finishing step


def test_client_tags_come_from_kv_transfer_params_and_bad_ones_are_ignored():
    params = {"kvtier": {"session_id": "chat-1", "turn": 2, "request_type": "subagent",
                         "parent_request_id": 7, "tier_config_id": "", "other": "x"},
              "max_load_tokens": 64}
    assert request_tags(params) == {"session_id": "chat-1", "turn": 2, "request_type": "subagent"}
    assert request_tags(None, session_id="from-vllm") == {"session_id": "from-vllm"}
    assert request_tags({"kvtier": "not an object"}) == {}
    assert request_tags({"kvtier": {"turn": True}}) == {}


def test_tracking_is_bounded(acc):
    _, recorder, clock = acc
    accounting = RequestTokenAccounting(recorder, 16, clock=clock, max_requests=2)
    for i in range(3):
        accounting.matched(f"r{i}", arrival_s=99.0, prompt_tokens=20, gpu_tokens=0, sources={})
        accounting.admitted(Req(), f"r{i}", 0, [])
    for i in range(3):
        accounting.finished(f"r{i}", status="FINISHED_STOPPED", output_tokens=1)
    _, requests = drained(recorder)
    assert [r["request_id"] for r in requests] == ["r0", "r1"]
    with pytest.raises(ValueError, match="block_size_tokens"):
        RequestTokenAccounting(recorder, 0)


def test_a_preempted_request_keeps_its_first_admissions_split(acc):
    """vLLM counts a request's prefix hits at its first admission only; after a preemption
    the request is looked up and admitted again (its hits recorded again as block events)."""
    accounting, recorder, _ = acc
    request = Req()
    accounting.matched("r", arrival_s=99.0, prompt_tokens=64, gpu_tokens=32, sources={})
    accounting.admitted(request, "r", 0, [1, 2, 3, 4])
    accounting.matched("r", arrival_s=99.0, prompt_tokens=64, gpu_tokens=48, sources={"host": 16})
    accounting.admitted(request, "r", 16, [1, 2, 3, 4])
    accounting.finished("r", status="FINISHED_LENGTH_CAPPED", output_tokens=2)
    events, (req,) = drained(recorder)
    assert (req["gpu_hit_tokens"], req["cpu_promotion_tokens"], req["recomputed_tokens"]) == (32, 0, 32)
    assert [e["block_hash"] for e in events] == [1, 2, 1, 2, 3]


@pytest.mark.parametrize("internal, external, client", [
    ("chatcmpl-7f3a-9a25cf86", None, "chatcmpl-7f3a"),   # vLLM's suffix: eight hex digits
    ("cmpl-x-9a25cf86", "cmpl-x", "cmpl-x"),              # the engine's own external id wins
    ("cmpl-7f3a-0-9a25cf86", None, "cmpl-7f3a"),          # completions: prompt index too
    ("cmpl-7f3a-12-9a25cf86", "cmpl-7f3a-12", "cmpl-7f3a"),
    ("chatcmpl-7f3a-0-9a25cf86", None, "chatcmpl-7f3a-0"),  # the chat API adds no index
    ("chatcmpl-7f3a", None, None),                        # randomisation off: ids agree
    ("batch-run-ABCDEFGH", None, None),                   # not hex: no suffix of vLLM's
    ("-9a25cf86", None, None),                            # nothing would be left
])
def test_the_client_request_id_is_the_engines_id_without_vllms_suffix(internal, external, client):
    assert client_request_id(internal, external) == client


def test_the_record_carries_the_client_request_id(acc):
    accounting, recorder, clock = acc
    accounting.matched("chatcmpl-7f3a-9a25cf86", arrival_s=1.0, prompt_tokens=32, gpu_tokens=0,
                       sources={})
    accounting.admitted(Req(), "chatcmpl-7f3a-9a25cf86", 0, ())
    record = accounting.finished("chatcmpl-7f3a-9a25cf86", status="FINISHED_STOPPED",
                                 client_request_id="chatcmpl-7f3a")
    assert (record.request_id, record.client_request_id) == ("chatcmpl-7f3a-9a25cf86", "chatcmpl-7f3a")



def test_the_record_carries_the_hand_off_from_arrival_to_the_scheduler(acc):
    accounting, recorder, clock = acc
    clock.now = 100.004  # the scheduler's add_request, 4 ms after the frontend stamped it
    accounting.received("r1", arrival_s=100.0, prompt_tokens=32)
    clock.now = 100.03
    accounting.matched("r1", arrival_s=100.0, prompt_tokens=32, gpu_tokens=0, sources={})
    accounting.admitted(Req(), "r1", 0, ())
    record = accounting.finished("r1", status="FINISHED_STOPPED", output_tokens=1)
    assert record.handoff_s == pytest.approx(0.004)
    assert record.ttft_s == pytest.approx(0.03)
    accounting.matched("r2", arrival_s=100.0, prompt_tokens=32, gpu_tokens=0, sources={})
    accounting.admitted(Req(), "r2", 0, ())  # an engine that never called on_new_request
    assert accounting.finished("r2", status="FINISHED_STOPPED", output_tokens=1).handoff_s is None
