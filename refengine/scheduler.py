"""Continuous batching: requests join the running batch whenever the GPU pool can hold them
and leave it as soon as they finish, at every engine step. First come, first served: a
request that does not fit yet holds the queue (no overtaking), so queueing is visible."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvtier.refengine.kv_manager import KvCacheManager
from kvtier.refengine.sequence import Sequence


@dataclass(frozen=True, slots=True)
class ScheduledWork:
    """What one step computes, decided before it runs (the scheduler's side of a
    ``StepRecord``): admitted requests prefill their uncached prompt tokens, whose context is
    what their tiers served (``cached_tokens``); every other running request decodes one token
    over its context. ``running_requests``/``waiting_requests`` are counted after admission."""

    prefill_tokens: int
    prefill_requests: int
    prefill_context_tokens: int
    cached_tokens: int
    decode_requests: int
    decode_context_tokens: int
    running_requests: int
    waiting_requests: int

    @property
    def computes(self) -> bool:
        return bool(self.prefill_requests or self.decode_requests)


class Scheduler:
    def __init__(self, max_batch_size: int):
        self.max_batch_size = max_batch_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.peak_waiting = 0  # most requests seen waiting at once: evidence of queueing

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.peak_waiting = max(self.peak_waiting, len(self.waiting))

    def admit(self, kv: KvCacheManager) -> list[Sequence]:
        """Move waiting requests into the batch while they fit; returns the admitted ones."""
        admitted = []
        while (self.waiting and len(self.running) < self.max_batch_size
               and kv.can_allocate(self.waiting[0])):
            seq = self.waiting.popleft()
            kv.allocate(seq)
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def work(self, admitted: list[Sequence]) -> ScheduledWork:
        """The step's work, once ``admitted`` (this step's admissions) hold their blocks."""
        decoding = [s for s in self.running if s not in admitted]
        return ScheduledWork(
            prefill_tokens=sum(s.prompt_len - s.num_computed for s in admitted),
            prefill_requests=len(admitted),
            prefill_context_tokens=sum(s.num_computed for s in admitted),
            cached_tokens=sum(s.cached_tokens for s in admitted),
            decode_requests=len(decoding),
            decode_context_tokens=sum(s.num_computed for s in decoding),
            running_requests=len(self.running), waiting_requests=len(self.waiting))

    def finish(self, seq: Sequence, kv: KvCacheManager) -> None:
        self.running.remove(seq)
        kv.free(seq)
        seq.finished = True
