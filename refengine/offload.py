"""Demotion down the tiers: GPU victim -> CPU tier -> file tier, with admission.

A block evicted from one tier is offered to the next. It is admitted only if requests used it
at least ``admission_threshold`` times (otherwise it is dropped, and a ``DROP`` event says
so); a full tier first evicts its own victim, which cascades further down. Blocks in
``protected`` (the hits of the request being admitted) are never chosen as victims.
Every store and eviction is recorded and published as it happens.
"""

from __future__ import annotations

import time
from typing import Callable

from kvtier.collector.events import Outcome, Tier
from kvtier.refengine.cpu_tier import CpuTier
from kvtier.refengine.file_tier import FileTier
from kvtier.refengine.kv_events import KvEventBuffer, block_removed, block_stored


class TierCascade:
    def __init__(self, cpu: CpuTier | None, file: FileTier | None, *, recorder, events: KvEventBuffer,
                 block_size: int, block_bytes: int, admission_threshold: int,
                 meta: Callable[[int], tuple[int | None, list[int]]],
                 sync: Callable[[], None], timer: Callable[[], float] = time.perf_counter,
                 stats=None):
        self.cpu, self.file = cpu, file
        self._recorder, self._events = recorder, events
        self._block_size, self._block_bytes = block_size, block_bytes
        self._threshold = admission_threshold
        self._meta, self._sync, self._timer = meta, sync, timer
        self._stats = stats

    def admits(self, uses: int) -> bool:
        return uses >= self._threshold

    def store(self, block_hash: int, tier: Tier, tier_from: Tier, latency_s: float | None) -> None:
        """Record and publish that ``block_hash`` now lives in ``tier``."""
        parent, tokens = self._meta(block_hash)
        self._recorder.record(Outcome.STORE, block_hash, parent_hash=parent, tokens=self._block_size,
                              size_bytes=self._block_bytes, tier_from=tier_from, tier_to=tier,
                              latency_s=latency_s)
        self._events.append(block_stored(block_hash, parent, tokens, self._block_size, tier))

    def evicted(self, block_hash: int, tier: Tier) -> None:
        self._recorder.record(Outcome.EVICT, block_hash, tokens=self._block_size,
                              size_bytes=self._block_bytes, tier_from=tier)
        self._events.append(block_removed(block_hash, tier))

    # ---- GPU -> CPU
    def demote_from_gpu(self, block_hash: int, block, uses: int, protected: set[int]) -> None:
        """Offer a GPU victim's bytes (``block``) to the CPU tier before its slot is reused."""
        cpu = self.cpu
        if cpu is None:
            return
        if block_hash in cpu:
            cpu.get(block_hash)  # still there from an earlier store: counts as a use
            return
        if not self.admits(uses) or (cpu.is_full and not self.make_room_cpu(protected)):
            self._recorder.record(Outcome.DROP, block_hash, tokens=self._block_size,
                                  size_bytes=self._block_bytes, tier_from=Tier.GPU)
            return
        start = self._timer()
        cpu.put(block_hash, block)
        self._sync()
        spent = self._timer() - start
        if self._stats is not None:
            self._stats.add("store", self._block_bytes, spent)
        self.store(block_hash, Tier.CPU, Tier.GPU, spent)

    def make_room_cpu(self, protected: set[int]) -> bool:
        """Evict one CPU victim (offering it to the file tier); ``False`` if none may go."""
        victim = self.cpu.victim(protected)
        if victim is None:
            return False
        self._demote_from_cpu(victim, protected)
        self.cpu.remove(victim)
        self.evicted(victim, Tier.CPU)
        return True

    # ---- CPU -> file
    def _demote_from_cpu(self, block_hash: int, protected: set[int]) -> None:
        file = self.file
        if file is None or block_hash in file:
            return
        if file.is_full and not self._make_room_file(protected):
            self._recorder.record(Outcome.DROP, block_hash, tokens=self._block_size,
                                  size_bytes=self._block_bytes, tier_from=Tier.CPU)
            return
        file.put(block_hash, self.cpu.peek(block_hash))

    def _make_room_file(self, protected: set[int]) -> bool:
        victim = self.file.victim(protected)
        if victim is None:
            return False
        self.file.remove(victim)
        self.evicted(victim, Tier.COLD)
        return True

    def file_stored(self, block_hash: int, size_bytes: int, latency_s: float) -> None:
        """The file tier's completion callback (runs on a writer thread)."""
        if self._stats is not None:
            self._stats.add("tier_write", size_bytes, latency_s)
        self.store(block_hash, Tier.COLD, Tier.CPU, latency_s)
