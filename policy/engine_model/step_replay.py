"""The engine model's replay: requests through transfer queues, a batch scheduler and
costed steps; TTFT, ITL and end-to-end latency per request come out.

Requests enter at their arrival times (open loop), or, where ``EngineRequests.follows``
names a predecessor, ``think_s`` after its predicted end (a closed-loop client), with their
prompt and output tokens and their tier split (from the tier replay, or as recorded). Each
can be scheduled a drawn admission delay after it arrives (``admission_delay_s``: the
frontend's tokenising and hand-off to the engine, which no step shows). Promotions delay a
request until its KV is on the GPU (vLLM's offloading connector: a load job's measured
latency, from the step that starts it to the step that sees it done, so the steps' spacing is
in the link's fit), or, in an engine that promotes inside the admitting step
(``SchedulerLimits.promotions``), cost that step (``transfers.py``). The scheduler
(``batch_scheduler.py``) puts requests into steps, each step costing
:class:`~kvtier.policy.engine_model.step_cost.StepCost` of its work plus a draw of the
fitted step noise (the prefill steps' own, where fitted apart, drawn from the steps of
like predicted work where fitted by it), which stretches the step's work evenly. A request's first token comes at the end of the step that computes its
last prompt token (or right after its own prefill, ``first_token="own_prefill"``: after the
step's overhead and the prefills before it, before the decode pass); each
later one at the end of a step that decodes it. Queueing and batching follow from the
steps; nothing else is added.

Runs of steps that only decode (nothing to prefill, nobody who could join) are advanced in
one go with numpy: their costs grow by a fixed amount a step (every context one token
longer), so thousands of requests replay in well under a second.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.collector.request_tokens import RequestTokens
from kvtier.policy.engine_model.batch_scheduler import BatchScheduler, StepPlan
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.engine_model.transfers import TransferQueues


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
    follows: np.ndarray | None = field(default=None, compare=False)
    think_s: np.ndarray | None = field(default=None, compare=False)
    block_hashes: tuple | None = field(default=None, compare=False)  # each prompt's, for sharing

    def __len__(self) -> int:
        return len(self.arrival_s)

    def closed_loop(self, follows: np.ndarray, think_s: np.ndarray) -> EngineRequests:
        """These requests, each sent ``think_s[i]`` after request ``follows[i]`` ended
        (``follows[i] == i``: at its arrival time); see ``closed_loop.client_chains``."""
        from dataclasses import replace

        return replace(self, follows=np.asarray(follows, dtype=np.int64),
                       think_s=np.asarray(think_s, dtype=float))

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord],
                     splits: Sequence[RequestTokens] | None = None) -> EngineRequests:
        """``splits`` (one per request, e.g. the tier replay's) replace the recorded split
        (``RequestTokens.measured``: a record without one recomputes its whole prompt).
        A request without ``output_tokens`` produces one."""
        if splits is None:
            splits = [RequestTokens.measured(r) for r in records]
        split = np.array([s.counts() for s in splits], dtype=np.int64).reshape(-1, 4)
        if len(split) != len(records):
            raise ValueError(f"{len(records)} records but {len(split)} tier splits")
        hashes = tuple(tuple(r.block_hashes) for r in records)
        return cls(np.array([r.arrival_s for r in records], dtype=float),
                   np.array([r.prompt_tokens for r in records], dtype=np.int64),
                   np.array([max(r.output_tokens or 1, 1) for r in records], dtype=np.int64),
                   split[:, 0], split[:, 1], split[:, 2], split[:, 3],
                   block_hashes=hashes if any(hashes) else None)


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
    steps' noise (``params.step_noise_s``) and, given, one of the step costs refitted on
    resampled steps (``params.step_cost_draws``); without it a generator seeded 0 draws the
    noise and the fitted step cost prices every step, so a replay repeats. Predictions draw
    through ``kvtier.policy.latency.predict``."""
    n = len(requests)
    if n == 0:
        empty = np.empty(0)
        return EngineReplay(empty, empty, empty, 0)
    run = _Run(requests, params, rng if rng is not None else np.random.default_rng(0),
               resampled_cost=rng is not None)
    run.until_done()
    first, end = run.first_token_s, run.end_s
    outputs = requests.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(outputs > 1, (end - first) / (outputs - 1), np.nan)
    return EngineReplay(first - run.arrival_s, itl, end - run.arrival_s, run.steps)


class _Run:
    """The mutable state of one replay: the clock, the scheduler, each request's progress."""

    def __init__(self, requests: EngineRequests, params: EngineModelParams,
                 rng: np.random.Generator, resampled_cost: bool = False):
        cost = params.step_cost
        if params.step_cost_draws and resampled_cost:  # the fit's own uncertainty, one per run
            cost = params.step_cost_draws[int(rng.integers(len(params.step_cost_draws)))]
        self.coefficients = cost.coefficients
        self.noise_s, self.rng = np.asarray(params.step_noise_s, dtype=float), rng
        prefill_noise = params.prefill_step_noise_s or params.step_noise_s
        self.prefill_noise_s = np.asarray(prefill_noise, dtype=float)
        self.noise_up_to_s = np.array([work for work, _ in params.prefill_noise_by_work], dtype=float)
        self.noise_by_work = [np.asarray(noise, dtype=float) for _, noise in params.prefill_noise_by_work]
        compute = np.maximum(requests.recompute_tokens, 1)  # the last prompt token is always computed
        self.prompt = np.maximum(requests.prompt_tokens, compute)
        self.outputs = requests.output_tokens
        self.generated = np.zeros(len(requests), dtype=np.int64)
        self.first_token_s = np.full(len(requests), np.nan)
        self.end_s = np.full(len(requests), np.nan)
        limits = params.limits
        need = None if limits.kv_blocks is None else \
            -(-(self.prompt + self.outputs) // limits.block_tokens)  # prompt and every output token
        hashes = requests.block_hashes
        if need is None or hashes is None or any(len(h) > k for h, k in zip(hashes, need.tolist())):
            hashes = None  # none recorded, or in another block size than the engine's
        self.compute = compute
        self.scheduler = BatchScheduler(limits, self.prompt, compute.copy(), kv_need=need,
                                        kv_hashes=hashes)
        self.own_prefill = params.limits.first_token == "own_prefill"
        self.requests, self.arrival_s = requests, requests.arrival_s.astype(float)
        self.transfers = TransferQueues(params.kv_bytes_per_token, params.cpu_link, params.cold_link,
                                        mode=params.limits.promotions)
        if params.limits.promotions == "load_step":
            self.scheduler.to_load = (requests.cpu_tokens + requests.cold_tokens) > 0
        n = len(requests)
        follows = requests.follows if requests.follows is not None else np.arange(n)
        self.successors: dict[int, list[int]] = {}
        for i, j in enumerate(follows.tolist()):
            if j != i:
                self.successors.setdefault(j, []).append(i)
        # two heaps of (time, request): arrivals to come, and arrived requests whose KV is
        # still moving (by ready time)
        # when each request can first be scheduled, after its arrival (its own draw)
        self.delay_s = self._noise_s(n, np.asarray(params.admission_delay_s, dtype=float))
        self.arriving = [(float(self.arrival_s[i] + self.delay_s[i]), i) for i in range(n)
                         if follows[i] == i]
        heapq.heapify(self.arriving)
        self.moving: list[tuple[float, int]] = []
        self.finished, self.steps = 0, 0
        self.now = self.arriving[0][0]

    def until_done(self) -> None:
        scheduler = self.scheduler
        while self.finished < len(self.prompt):
            self._take_arrivals()
            if not scheduler.running and not scheduler.waiting:
                self.now = self._next_event_s()
            elif not scheduler.prefilling() and not scheduler.can_admit():
                self._decode_run()
            else:
                self._step(scheduler.schedule())

    def _next_event_s(self) -> float:
        return min(heap[0][0] for heap in (self.arriving, self.moving) if heap)

    def _take_arrivals(self) -> None:
        r = self.requests
        while self.arriving and self.arriving[0][0] <= self.now:
            start, i = heapq.heappop(self.arriving)
            ready = self.transfers.ready_at(start, int(r.cpu_tokens[i]), int(r.cold_tokens[i]))
            heapq.heappush(self.moving, (ready, i))
        while self.moving and self.moving[0][0] <= self.now:
            self.scheduler.add(heapq.heappop(self.moving)[1])

    def _step(self, plan: StepPlan) -> None:
        c = self.coefficients
        # each chunk's prefill, in the order the step runs them (after the step's overhead);
        # a request's first chunk maps what it found cached and loads what it promotes first
        prefilled = np.cumsum([c[1] * t + c[2] + c[3] * t * (ctx + t / 2) + self._start_s(i, ctx)
                               for i, t, ctx in plan.chunks])
        decoding = np.fromiter(plan.decoding, dtype=np.int64, count=len(plan.decoding))
        context = float((self.prompt[decoding] + self.generated[decoding]).sum())
        prefill_s = float(prefilled[-1]) if len(prefilled) else 0.0
        decode_s = c[4] * len(decoding) + c[5] * context + (c[6] if len(decoding) else 0.0)
        r = self.requests
        load_s = sum(self.transfers.step_load_s(int(r.cpu_tokens[i]), int(r.cold_tokens[i]), c[8])
                     for i in plan.loading)
        # overhead, the prefills in turn, the decode pass; loads the step admitted (load_step)
        work_s = c[0] + prefill_s + decode_s + load_s
        # a host's stall lands anywhere in the step: its noise stretches the step's work
        # evenly, so a prefill run first sees only its share of it
        noise = self._prefill_noise(work_s) if plan.chunks else self.noise_s
        taken_s = max(work_s + float(self._noise_s(1, noise)[0]), 0.0)
        stretch = taken_s / work_s if work_s > 0 else 1.0
        start, self.now = self.now, self.now + taken_s
        self.steps += 1
        started = np.array(self.scheduler.computed(plan), dtype=np.int64)
        if self.own_prefill and len(started):
            done_at = {i: start + (c[0] + p) * stretch for (i, _, _), p in zip(plan.chunks, prefilled)}
            self.first_token_s[started] = [done_at[i] for i in started.tolist()]
        else:
            self.first_token_s[started] = self.now
        self._emit(np.concatenate([started, decoding]), 1)

    def _start_s(self, request: int, context: int) -> float:
        """What ``request``'s first chunk (its context is then what it found cached) spends
        mapping its cached tokens and loading its promoted ones; 0 for a later chunk."""
        cached = int(self.prompt[request] - self.compute[request])
        if context != cached:
            return 0.0
        r, c = self.requests, self.coefficients
        return float(c[7] * cached + self.transfers.in_step_s(int(r.cpu_tokens[request]),
                                                              int(r.cold_tokens[request]), c[8]))

    def _decode_run(self) -> None:
        """Steps in which every running request decodes and nobody can join, up to the first
        finish or (when one could then join) the step during which the next request arrives."""
        c, running = self.coefficients, np.array(self.scheduler.running, dtype=np.int64)
        width = len(running)
        remaining = int((self.outputs[running] - self.generated[running]).min())
        context = float((self.prompt[running] + self.generated[running]).sum())
        base = c[0] + c[4] * width + c[5] * context + c[6]
        steps = np.arange(1, remaining + 1)
        work = base + c[5] * width * (steps - 1)
        ends = self.now + np.cumsum(np.maximum(work + self._noise_s(remaining, self.noise_s), 0.0))
        k = remaining
        if (self.arriving or self.moving) and width < self.scheduler.limits.max_running:
            k = min(k, int(np.searchsorted(ends, self._next_event_s())) + 1)
        self.now = float(ends[k - 1])
        self.steps += k
        self._emit(running, k)

    def _prefill_noise(self, work_s: float) -> np.ndarray:
        """The noise quantiles a prefill step of ``work_s`` draws from: its work's range's
        where the fit kept them apart, else the prefill steps' own."""
        if not self.noise_by_work:
            return self.prefill_noise_s
        at = int(np.searchsorted(self.noise_up_to_s, work_s))
        return self.noise_by_work[min(at, len(self.noise_by_work) - 1)]

    def _noise_s(self, steps: int, quantiles: np.ndarray) -> np.ndarray:
        """``steps`` draws from a distribution given by its evenly spaced ``quantiles``
        (zeros when there are none)."""
        if not len(quantiles):
            return np.zeros(steps)
        grid = np.linspace(0.0, 1.0, len(quantiles))
        return np.interp(self.rng.random(steps), grid, quantiles)

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
            for j in done.tolist():
                for i in self.successors.get(j, ()):
                    self.arrival_s[i] = self.now + float(self.requests.think_s[i])
                    heapq.heappush(self.arriving, (self.arrival_s[i] + self.delay_s[i], i))
