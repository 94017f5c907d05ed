"""The batch scheduler: which requests a step decodes and which prompt tokens it computes.

Continuous batching with vLLM's order of service: every running request past its prompt
decodes one token; running requests still in their prompt continue; then waiting requests
join, first come first served (no overtaking), while the running set has room
(``max_running``) and the step's token budget lasts. With ``chunked_prefill`` a prompt
larger than what is left of the budget is split across steps; without it, it waits for a
step with room (or runs alone when nothing else is scheduled, so it is never stuck).
``token_budget=None`` is no budget: kvtier's reference engine prefills every admitted
request whole in the step it joins.

A prompt always costs at least one token of one step: an engine computes the last prompt
token to produce the first output token, even when every block was cached.

With ``kv_blocks`` (the GPU's KV capacity in blocks of ``block_tokens``), a waiting request
joins only while the running requests' blocks and its own fit (the reference engine reserves
a request's prompt and every token it may generate when it admits it; vLLM admits while its
free blocks hold the prompt): long prompts under concurrency run fewer at a time than
``max_running`` allows and queue meanwhile. Given each request's prompt block hashes
(``kv_hashes``), a prompt block that running requests already hold costs a joining request
nothing, as in both engines' prefix caches (a session's turns sent by concurrent clients
share their history: counted once per request, the reference engine's agentic load at
concurrency 4 queued in the model, TTFT p50 1.5x over); without them every request's
blocks count in full.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np


FIRST_TOKEN = ("step_end", "own_prefill")
PROMOTIONS = ("queued", "in_step", "load_step")


@dataclass(frozen=True)
class SchedulerLimits:
    """An engine's batching limits (vLLM: ``max_num_seqs``, ``max_num_batched_tokens``,
    ``enable_chunked_prefill``; the reference engine: ``max_batch_size``, no budget), and
    when a prompt's first token comes out: at the end of the step (``step_end``: vLLM, which
    samples the whole batch at once) or right after its own prefill, the step's prefills
    running one request after another before its decodes (``own_prefill``: the reference
    engine). ``promotions``: where a request's promoted KV is copied: before it is scheduled,
    on the transfer links, while steps run on (``queued``: vLLM's offloading connector loads
    asynchronously), inside the step that admits it, which costs that step
    ``StepCost.loaded_byte_s`` a byte (``in_step``: the reference engine), or in a step of
    its own (``load_step``: vLLM's offloading connector): the scheduler admits the request to
    load, which allocates its KV and costs that step ``loaded_byte_s`` a byte, computes nothing
    for it, and schedules it from the next step on; requests behind it are not held up. A
    promotion then waits about one step whatever its size, which a bandwidth fit over load
    jobs reads as a slow link (vLLM on the CPU: ~4 ms a job from 1 to 32 blocks)."""

    max_running: int = 256
    token_budget: int | None = None
    chunked_prefill: bool = False
    first_token: str = "step_end"
    kv_blocks: int | None = None
    block_tokens: int = 16
    promotions: str = "queued"

    def __post_init__(self) -> None:
        for name, value in (("kv_blocks", self.kv_blocks), ("block_tokens", self.block_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1{' or None' if name == 'kv_blocks' else ''}, "
                                 f"got {value!r}")
        if isinstance(self.max_running, bool) or not isinstance(self.max_running, int) \
                or self.max_running < 1:
            raise ValueError(f"max_running must be an int >= 1, got {self.max_running!r}")
        if self.token_budget is not None and (isinstance(self.token_budget, bool) or not
                                              isinstance(self.token_budget, int) or self.token_budget < 1):
            raise ValueError(f"token_budget must be None or an int >= 1, got {self.token_budget!r}")
        if self.first_token not in FIRST_TOKEN:
            raise ValueError(f"first_token must be one of {', '.join(FIRST_TOKEN)}, got {self.first_token!r}")
        if self.promotions not in PROMOTIONS:
            raise ValueError(f"promotions must be one of {', '.join(PROMOTIONS)}, got {self.promotions!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StepPlan:
    """One step's work: ``chunks`` as (request, prompt tokens, context before them)."""

    chunks: tuple[tuple[int, int, int], ...]
    decoding: tuple[int, ...]
    loading: tuple[int, ...] = ()  # requests admitted to load their promoted KV (load_step)


@dataclass
class BatchScheduler:
    """Waiting and running requests by index; ``prompt_left[i]`` prompt tokens request ``i``
    still has to compute, ``prompt_tokens[i]`` its whole prompt."""

    limits: SchedulerLimits
    prompt_tokens: np.ndarray
    prompt_left: np.ndarray
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    in_prompt: set = field(default_factory=set)  # running requests with prompt tokens left
    kv_need: np.ndarray | None = None  # blocks each request holds while running (with kv_blocks)
    kv_used: int = 0
    kv_hashes: list | None = None  # each request's prompt block hashes (shared blocks count once)
    held: dict = field(default_factory=dict)  # prompt block -> how many running requests hold it
    to_load: np.ndarray | None = None  # load_step: requests whose promoted KV is still to load
    kv_counted: set = field(default_factory=set)  # requests whose KV counts in kv_used

    def add(self, request: int) -> None:
        self.waiting.append(request)

    def can_admit(self) -> bool:
        """Whether a waiting request could join the running set now (its KV fits, or nothing
        runs: a request larger than the whole capacity still runs alone)."""
        if not self.waiting or len(self.running) >= self.limits.max_running:
            return False
        if self.kv_need is None or self.limits.kv_blocks is None or not self.running:
            return True
        return self.kv_used + self._need(self.waiting[0]) <= self.limits.kv_blocks

    def _need(self, request: int) -> int:
        """Blocks ``request`` would add to what the running requests hold."""
        if request in self.kv_counted:
            return 0
        need = int(self.kv_need[request])
        if self.kv_hashes is not None:
            need -= sum(1 for h in self.kv_hashes[request] if h in self.held)
        return need

    def prefilling(self) -> bool:
        return bool(self.in_prompt)

    def schedule(self) -> StepPlan:
        """Plan the next step, moving the waiting requests it starts into the running set."""
        budget = self.limits.token_budget if self.limits.token_budget is not None else np.inf
        in_prompt = self.in_prompt
        decoding = [i for i in self.running if i not in in_prompt]
        budget -= len(decoding)
        chunks, loading = [], []
        for i in self.running:
            if i in in_prompt:
                budget = self._take(i, budget, chunks, bool(decoding))
        while self.can_admit() and budget > 0:
            if self.to_load is not None and self.to_load[self.waiting[0]]:
                request = self.waiting.popleft()  # its KV is allocated and loads in this step
                self.to_load[request] = False
                self._hold(request)
                loading.append(request)
                continue
            before = len(chunks)
            budget = self._take(self.waiting[0], budget, chunks, bool(decoding))
            if len(chunks) == before:
                break
            request = self.waiting.popleft()
            self.running.append(request)
            in_prompt.add(request)
            self._hold(request)
        # loaded requests wait at the head of the queue for the next step, in their order
        self.waiting.extendleft(reversed(loading))
        return StepPlan(tuple(chunks), tuple(decoding), tuple(loading))

    def _hold(self, request: int) -> None:
        """Count ``request``'s KV blocks (once) against the capacity."""
        if self.kv_need is None or request in self.kv_counted:
            return
        self.kv_used += self._need(request)
        self.kv_counted.add(request)
        if self.kv_hashes is not None:
            held = self.held
            for h in self.kv_hashes[request]:
                held[h] = held.get(h, 0) + 1

    def computed(self, plan: StepPlan) -> list[int]:
        """Record that ``plan``'s chunks ran; the requests whose prompt is now done."""
        done = []
        for i, tokens, _ in plan.chunks:
            self.prompt_left[i] -= tokens
            if self.prompt_left[i] == 0:
                self.in_prompt.discard(i)
                done.append(i)
        return done

    def _take(self, i: int, budget: float, chunks: list, busy: bool) -> float:
        left = int(self.prompt_left[i])
        tokens = min(left, budget) if self.limits.chunked_prefill else left
        if tokens <= 0 or (tokens > budget and (chunks or busy)):
            return budget
        chunks.append((i, int(tokens), int(self.prompt_tokens[i] - left)))
        return budget - tokens

    def finish(self, requests) -> None:
        gone = set(requests)
        self.running = [i for i in self.running if i not in gone]
        if self.kv_need is None:
            return
        held = self.held
        for request in gone:  # its own blocks, and the shared ones nobody else still holds
            self.kv_counted.discard(request)
            freed = int(self.kv_need[request])
            for h in self.kv_hashes[request] if self.kv_hashes is not None else ():
                if held[h] > 1:
                    held[h] -= 1
                    freed -= 1
                else:
                    del held[h]
            self.kv_used -= freed
