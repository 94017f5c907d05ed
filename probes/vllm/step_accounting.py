"""One ``StepRecord`` per vLLM scheduler step, from the connector's scheduler side. Free of
vLLM types (it reads ``SchedulerOutput`` by attribute): the connector
(``probes/vllm/connector.py``) calls one method per hook.

Where each field comes from (vLLM 0.32 and 0.33, whose ``SchedulerOutput`` and
``CachedRequestData`` carry the same fields read here):

* ``time_s``: when ``build_connector_meta(scheduler_output)`` ran, at the end of the
  scheduler's ``schedule()``; ``step`` counts those calls from the engine's start.
* ``duration_s``: from that moment to the step's ``take_events()``, which the scheduler calls
  in ``update_from_output`` once the step's model output is applied: the step's measured time
  (model execution and output processing; an idle engine between steps is not counted).
  Steps end in the order they were scheduled, also with async scheduling (where the next
  ``schedule()`` runs before this step ends, so steps overlap), so they are paired first in,
  first out. The step is recorded when it ends, so the engine never waits for anything;
  one whose end never comes (engine shutdown; more than :data:`MAX_OPEN_STEPS` open) is
  recorded with ``duration_s`` ``None``.
* prefill: every request in ``scheduled_new_reqs``, every resumed (preempted) request in
  ``scheduled_cached_reqs``, and every other cached request whose ``num_computed_tokens``
  is still below its prompt (a chunked prefill's next chunk; the prompt length is
  ``Request.num_prompt_tokens`` at ``update_state_after_alloc``): its
  ``num_scheduled_tokens`` count as ``prefill_tokens`` and its ``num_computed_tokens`` as
  context. A resumed request recomputes its output tokens too, so after preemptions
  ``prefill_tokens`` exceeds the prompt tokens vLLM counts as computed.
* ``cached_tokens``: ``num_computed_tokens`` of new and resumed requests (GPU prefix hits and
  tokens loaded from the offloading tiers).
* decode: every other scheduled request (one token, or more with speculative decoding),
  ``decode_context_tokens`` their ``num_computed_tokens``.
* ``running_requests``: the requests scheduled in the step; ``waiting_requests`` is always 0:
  the connector never sees the scheduler's waiting queue (only the requests it tries to
  admit). ``preempted_requests``: ``preempted_req_ids``.
* ``loaded_bytes`` / ``stored_bytes``: chunks the offloading manager prepared to load
  (``update_state_after_alloc``) and to store (``build_connector_meta``) during this
  ``schedule()``, times the bytes of one chunk (kvtier's spec wrapper counts them,
  ``probes/vllm/recording.py``; 0 under a spec that is not kvtier's).

Steps that scheduled no token, preempted nothing and moved no bytes (vLLM takes empty steps
while transfers drain) are not recorded; their numbers are skipped. A step that only started
loads is recorded: a request whose prefix comes from the CPU tier is admitted in one step
(its chunks prepared to load, nothing scheduled: it waits for the load) and computes in a
later one.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

MAX_OPEN_STEPS = 64  # steps scheduled whose end has not come: more means ends are not seen


class StepAccounting:
    """Turns each scheduled step into one ``Recorder.record_step`` call (see module doc).

    Runs on the scheduler's thread; ``clock`` gives Unix seconds, ``timer`` a monotonic
    clock for durations.
    """

    def __init__(self, recorder, *, clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter):
        self._recorder = recorder
        self._clock, self._timer = clock, timer
        self._prompts: dict[str, int] = {}  # request id -> prompt tokens, while it runs
        self._open: deque[tuple[float, tuple]] = deque()  # (started on timer, record fields)
        self._steps = 0

    def admitted(self, request_id: str, prompt_tokens: int) -> None:
        self._prompts[request_id] = prompt_tokens

    def finished(self, request_id: str) -> None:
        self._prompts.pop(request_id, None)

    def scheduled(self, output, loaded_bytes: int = 0, stored_bytes: int = 0) -> None:
        """``build_connector_meta(output)``: the step is planned."""
        started, time_s, step = self._timer(), self._clock(), self._steps
        self._steps += 1
        if len(self._open) >= MAX_OPEN_STEPS:
            self._record(self._open.popleft(), None)
        try:
            work = self._work(output, moved=bool(loaded_bytes or stored_bytes))
        except Exception:  # a SchedulerOutput of another shape must never break the engine
            self._recorder.rejected_events += 1
            work = None
        # an empty step stays in line too: its end is the next take_events() all the same
        self._open.append((started, (time_s, step, work, loaded_bytes, stored_bytes)))

    def ended(self) -> None:
        """``take_events()``: the oldest open step's output has been applied."""
        if self._open:
            step = self._open.popleft()
            self._record(step, self._timer() - step[0])

    def close(self) -> None:
        """Engine shutdown: record the steps still open, their end unknown."""
        while self._open:
            self._record(self._open.popleft(), None)

    def _record(self, step, duration_s: float | None) -> None:
        time_s, number, work, loaded_bytes, stored_bytes = step[1]
        if work is None:
            return
        self._recorder.record_step(time_s, number, duration_s, *work,
                                   loaded_bytes=loaded_bytes, stored_bytes=stored_bytes)

    def _work(self, output, *, moved: bool) -> tuple | None:
        """(prefill tokens, prefill requests, prefill context, cached, decode requests,
        decode context, running, waiting, preempted), or ``None`` for an empty step."""
        scheduled = output.num_scheduled_tokens
        preempted = len(getattr(output, "preempted_req_ids", None) or ())
        if not scheduled and not preempted and not moved:
            return None
        prefill = [0, 0, 0, 0]  # tokens, requests, context, cached
        decode = [0, 0]  # requests, context
        for new in output.scheduled_new_reqs:
            _add(prefill, scheduled.get(new.req_id, 0), new.num_computed_tokens, cached=True)
        cached = output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", None) or ()
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens):
            if req_id in resumed:
                _add(prefill, scheduled.get(req_id, 0), computed, cached=True)
            elif computed < self._prompts.get(req_id, 0):
                _add(prefill, scheduled.get(req_id, 0), computed, cached=False)
            else:
                decode[0] += 1
                decode[1] += computed
        return (*prefill, *decode, len(scheduled), 0, preempted)


def _add(prefill: list, tokens: int, computed: int, *, cached: bool) -> None:
    prefill[0] += tokens
    prefill[1] += 1
    prefill[2] += computed
    if cached:
        prefill[3] += computed
