"""Continuous batching: requests join the running batch whenever the GPU pool can hold them
and leave it as soon as they finish, at every engine step. First come, first served: a
request that does not fit yet holds the queue (no overtaking), so queueing is visible."""

from __future__ import annotations

from collections import deque

from kvtier.refengine.kv_manager import KvCacheManager
from kvtier.refengine.sequence import Sequence


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

    def finish(self, seq: Sequence, kv: KvCacheManager) -> None:
        self.running.remove(seq)
        kv.free(seq)
        seq.finished = True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
