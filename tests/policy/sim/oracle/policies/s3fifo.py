"""S3-FIFO (Yang et al., SOSP'23), following the authors' libCacheSim ``S3FIFO.c``.

A small FIFO (10% of capacity) filters one-hit wonders, a main FIFO (the rest) reinserts
used keys like a 2-bit clock, and a ghost FIFO (90% of capacity) remembers keys evicted from
the small queue. A new key enters the small queue, or main if the ghost remembers it (and,
until the first eviction, main once the small queue is full). Evicting from the small queue:
a key used at least ``MOVE_TO_MAIN_THRESHOLD`` times moves to main, otherwise it leaves and the
ghost remembers it. Evicting from main: a used key is reinserted with its count (capped at 3)
minus one, an unused one leaves. Main is evicted when it is over its share or small is empty.
A test checks hit counts equal to libCacheSim's on the same streams.
"""

from __future__ import annotations

from collections import OrderedDict

from kvtier.policy.sim.policies.base import BlockInfo, CachePolicy, Key

SMALL_FRACTION = 0.10
GHOST_FRACTION = 0.90
MOVE_TO_MAIN_THRESHOLD = 2
MAX_FREQUENCY = 3


class S3FIFO(CachePolicy):
    """Quick demotion of one-hit wonders through a small probationary FIFO."""

    name = "s3fifo"

    def __init__(self, capacity_blocks: int | None) -> None:
        super().__init__(capacity_blocks)
        c = capacity_blocks or 0
        self.small_capacity = max(1, int(c * SMALL_FRACTION))
        self.main_capacity = c - self.small_capacity
        self._ghost_capacity = int(c * GHOST_FRACTION)
        self._small: OrderedDict = OrderedDict()  # key -> use count, oldest first
        self._main: OrderedDict = OrderedDict()
        self._ghost: OrderedDict = OrderedDict()
        self._from_ghost = False
        self._has_evicted = False

    def _before_insert(self, key: Key, info: BlockInfo) -> None:
        self._from_ghost = self._ghost.pop(key, False) is None

    def _store(self, key: Key, info: BlockInfo) -> None:
        warming_up = not self._has_evicted and len(self._small) >= self.small_capacity
        if self._from_ghost or warming_up:
            self._main[key] = 0
        else:
            self._small[key] = 0

    def _hit(self, key: Key, info: BlockInfo) -> None:
        queue = self._small if key in self._small else self._main
        queue[key] += 1

    def _evict(self) -> Key:
        self._has_evicted = True
        while True:
            if len(self._main) > self.main_capacity or not self._small:
                victim = self._evict_main()
            else:
                victim = self._evict_small()
            if victim is not None:
                return victim

    def _evict_small(self) -> Key | None:
        while self._small:
            key, uses = self._small.popitem(last=False)
            if uses < MOVE_TO_MAIN_THRESHOLD:
                self._remember(key)
                return key
            self._main[key] = 0
        return None

    def _evict_main(self) -> Key:
        while True:
            key, uses = self._main.popitem(last=False)
            if uses == 0:
                return key
            self._main[key] = min(uses, MAX_FREQUENCY) - 1

    def _forget(self, key: Key) -> None:
        if self._small.pop(key, None) is None:
            del self._main[key]

    def _remember(self, key: Key) -> None:
        if self._ghost_capacity <= 0 or key in self._ghost:
            return
        self._ghost[key] = None
        if len(self._ghost) > self._ghost_capacity:
            self._ghost.popitem(last=False)
