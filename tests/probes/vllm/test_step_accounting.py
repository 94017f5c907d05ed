"""The connector's step accounting without vLLM: steps end in order, an end that never comes
is recorded without a duration, and nothing it is handed breaks the engine."""

from __future__ import annotations

from types import SimpleNamespace

from kvtier.collector.events import Origin
from kvtier.collector.recorder import Recorder
from kvtier.probes.vllm.step_accounting import MAX_OPEN_STEPS, StepAccounting


def output(decoding: dict[str, int]):
    """A decode-only step: each request id with its context."""
    cached = SimpleNamespace(req_ids=list(decoding), num_computed_tokens=list(decoding.values()),
                             resumed_req_ids=set())
    return SimpleNamespace(num_scheduled_tokens={r: 1 for r in decoding}, scheduled_new_reqs=[],
                           scheduled_cached_reqs=cached, preempted_req_ids=None)


def accounting():
    now, timer = [100.0], [0.0]
    recorder = Recorder(Origin("vllm", "i", "s"), clock=lambda: now[0])
    return StepAccounting(recorder, clock=lambda: now[0], timer=lambda: timer[0]), recorder, timer


def test_a_step_whose_end_never_comes_is_recorded_at_shutdown_without_a_duration():
    steps, recorder, timer = accounting()
    steps.scheduled(output({"a": 10}))
    timer[0] = 0.5
    steps.ended()
    steps.scheduled(output({"a": 11, "b": 20}))
    steps.close()
    rows = recorder.take_events().step_records.to_pylist()
    assert [(r["step"], r["duration_s"], r["decode_requests"], r["decode_context_tokens"])
            for r in rows] == [(0, 0.5, 1, 10), (1, None, 2, 31)]
    steps.ended()  # an end with no open step is ignored
    assert recorder.take_events() is None


def test_open_steps_are_bounded_and_an_odd_scheduler_output_is_counted_not_raised():
    steps, recorder, _ = accounting()
    steps.scheduled(SimpleNamespace(num_scheduled_tokens={"a": 1}))  # no request lists
    for _ in range(MAX_OPEN_STEPS):
        steps.scheduled(output({"a": 5}))
    batch = recorder.take_events()
    assert recorder.rejected_events == 0 and dict(batch.rejected) == {
        "wrong type in record() call": 1}
    assert batch.step_records.num_rows == 0  # the odd step left the line, unrecorded
    steps.close()
    assert recorder.take_events().step_records.column("step").to_pylist() == list(
        range(1, MAX_OPEN_STEPS + 1))
