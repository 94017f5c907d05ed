"""The engine model's replay: requests through transfer queues, a batch scheduler and
costed steps; TTFT, ITL and end-to-end latency per request come out.

Requests enter at their arrival times with their prompt and output tokens and their tier
split (from the tier replay, or as recorded). Promotions delay a request until its KV is on
the GPU (``transfers.py``); then the scheduler (``scheduler.py``) puts it into steps, each
step costing :class:`~kvtier.policy.engine_model.step_cost.StepCost` of its work. A
request's first token comes at the end of the step that computes its last prompt token;
each later one at the end of a step that decodes it. Queueing and batching follow from the
steps; nothing else is added.

Runs of steps that only decode (nothing to prefill, nobody who could join) are advanced in
one go with numpy: their costs grow by a fixed amount a step (every context one token
longer), so thousands of requests replay in well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.engine_model.scheduler import BatchScheduler, StepPlan
from kvtier.policy.engine_model.transfers import ready_s


@dataclass(frozen=True)
class EngineRequests:
    """Requests as arrays, one entry each; token splits are prompt tokens per tier."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    gpu_tokens: np.ndarray
    cpu_tokens: np.ndarray
    cold_tokens: np.ndarray
    recompute_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord],
                     splits: Sequence[tuple[int, int, int, int]] | None = None) -> EngineRequests:
        """``splits`` (GPU, CPU, cold, recompute tokens per request, e.g. the tier replay's)
        replace the recorded split; a record without one recomputes its whole prompt.
        A request without ``output_tokens`` produces one."""
        if splits is None:
            splits = [(r.gpu_hit_tokens or 0, r.cpu_promotion_tokens or 0,
                       r.cold_promotion_tokens or 0,
                       r.prompt_tokens if r.recomputed_tokens is None else r.recomputed_tokens)
                      for r in records]
        split = np.array(splits, dtype=np.int64).reshape(-1, 4)
        if len(split) != len(records):
            raise ValueError(f"{len(records)} records but {len(split)} tier splits")
        return cls(np.array([r.arrival_s for r in records], dtype=float),
                   np.array([r.prompt_tokens for r in records], dtype=np.int64),
                   np.array([max(r.output_tokens or 1, 1) for r in records], dtype=np.int64),
                   split[:, 0], split[:, 1], split[:, 2], split[:, 3])


@dataclass(frozen=True)
class EngineReplay:
    """Per request (in the order given): seconds to the first token, mean seconds between
    tokens (NaN for one output token) and to the last token; how many steps ran."""

    ttft_s: np.ndarray
    itl_s: np.ndarray
    e2e_s: np.ndarray
    steps: int


def replay(requests: EngineRequests, params: EngineModelParams,
           rng: np.random.Generator | None = None) -> EngineReplay:
    """Run ``requests`` through the engine model (see the module doc). ``rng`` draws the
    steps' spread (``params.step_spread``; default a generator seeded 0, so a replay
    repeats)."""
    n = len(requests)
    if n == 0:
        empty = np.empty(0)
        return EngineReplay(empty, empty, empty, 0)
    ready = ready_s(requests.arrival_s, requests.cpu_tokens, requests.cold_tokens,
                    params.kv_bytes_per_token, params.cpu_link, params.cold_link)
    run = _Run(requests, params, ready, rng if rng is not None else np.random.default_rng(0))
    run.until_done()
    first, end = run.first_token_s, run.end_s
    outputs = requests.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(outputs > 1, (end - first) / (outputs - 1), np.nan)
    return EngineReplay(first - requests.arrival_s, itl, end - requests.arrival_s, run.steps)


class _Run:
    """The mutable state of one replay: the clock, the scheduler, each request's progress."""

    def __init__(self, requests: EngineRequests, params: EngineModelParams, ready: np.ndarray,
                 rng: np.random.Generator):
        self.coefficients = params.step_cost.coefficients
        self.spread, self.rng = np.asarray(params.step_spread, dtype=float), rng
        compute = np.maximum(requests.recompute_tokens, 1)  # the last prompt token is always computed
        self.prompt = np.maximum(requests.prompt_tokens, compute)
        self.outputs = requests.output_tokens
        self.generated = np.zeros(len(requests), dtype=np.int64)
        self.first_token_s = np.full(len(requests), np.nan)
        self.end_s = np.full(len(requests), np.nan)
        self.scheduler = BatchScheduler(params.limits, self.prompt, compute.copy())
        self.ready, self.order = ready, np.argsort(ready, kind="stable")
        self.next, self.finished, self.steps = 0, 0, 0
        self.now = float(ready[self.order[0]])

    def until_done(self) -> None:
        scheduler = self.scheduler
        while self.finished < len(self.ready):
            self._take_arrivals()
            if not scheduler.running and not scheduler.waiting:
                self.now = float(self.ready[self.order[self.next]])
            elif not scheduler.prefilling() and not scheduler.can_admit():
                self._decode_run()
            else:
                self._step(scheduler.schedule())

    def _take_arrivals(self) -> None:
        while self.next < len(self.order) and self.ready[self.order[self.next]] <= self.now:
            self.scheduler.add(int(self.order[self.next]))
            self.next += 1

    def _step(self, plan: StepPlan) -> None:
        c = self.coefficients
        tokens = sum(t for _, t, _ in plan.chunks)
        attention = sum(t * (ctx + t / 2) for _, t, ctx in plan.chunks)
        decoding = np.fromiter(plan.decoding, dtype=np.int64, count=len(plan.decoding))
        context = float((self.prompt[decoding] + self.generated[decoding]).sum())
        self.now += float((c[0] + c[1] * tokens + c[2] * len(plan.chunks) + c[3] * attention
                           + c[4] * len(decoding) + c[5] * context) * self._spread(1)[0])
        self.steps += 1
        started = np.array(self.scheduler.computed(plan), dtype=np.int64)
        self.first_token_s[started] = self.now
        self._emit(np.concatenate([started, decoding]), 1)

    def _decode_run(self) -> None:
        """Steps in which every running request decodes and nobody can join, up to the first
        finish or (when one could then join) the step during which the next request arrives."""
        c, running = self.coefficients, np.array(self.scheduler.running, dtype=np.int64)
        width = len(running)
        remaining = int((self.outputs[running] - self.generated[running]).min())
        context = float((self.prompt[running] + self.generated[running]).sum())
        base = c[0] + c[4] * width + c[5] * context
        steps = np.arange(1, remaining + 1)
        ends = self.now + np.cumsum((base + c[5] * width * (steps - 1)) * self._spread(remaining))
        k = remaining
        if self.next < len(self.order) and width < self.scheduler.limits.max_running:
            k = min(k, int(np.searchsorted(ends, self.ready[self.order[self.next]])) + 1)
        self.now = float(ends[k - 1])
        self.steps += k
        self._emit(running, k)

    def _spread(self, steps: int) -> np.ndarray:
        """Each of ``steps`` steps' multiplier: a draw from the spread's quantiles."""
        if not len(self.spread):
            return np.ones(steps)
        grid = np.linspace(0.0, 1.0, len(self.spread))
        return np.interp(self.rng.random(steps), grid, self.spread)

    def _emit(self, requests: np.ndarray, tokens: int) -> None:
        """``requests`` each produced ``tokens`` tokens by now; those done leave."""
        if not len(requests):
            return
        self.generated[requests] += tokens
        done = requests[self.generated[requests] >= self.outputs[requests]]
        if len(done):
            self.end_s[done] = self.now
            self.scheduler.finish(done.tolist())
            self.finished += len(done)
