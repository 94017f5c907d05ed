"""S3-FIFO (Yang et al., SOSP'23): a small FIFO filter, a main FIFO, and a ghost FIFO.

New keys enter the small queue (10% of capacity); a key evicted from it that was used while
there moves to the main queue, otherwise it leaves and is remembered in the ghost queue. A
ghost key that comes back goes straight to main. Main is FIFO with reinsertion: a key with a
use count above zero is reinserted with the count decremented (counts saturate at 3).
"""

from __future__ import annotations

from collections import OrderedDict

from policy.sim.policies.base import BlockInfo, CachePolicy, Key

SMALL_FRACTION = 0.1
MAX_FREQUENCY = 3


class S3FIFO(CachePolicy):
    """Quick demotion of one-hit wonders through a small probationary FIFO."""

    name = "s3fifo"

    def __init__(self, capacity_blocks: int | None) -> None:
        super().__init__(capacity_blocks)
        c = capacity_blocks or 0
        self.small_capacity = max(1, int(c * SMALL_FRACTION))
        self._ghost_capacity = c
        self._small: OrderedDict = OrderedDict()  # key -> use count, oldest first
        self._main: OrderedDict = OrderedDict()
        self._ghost: OrderedDict = OrderedDict()

    def _store(self, key: Key, info: BlockInfo) -> None:
        if self._ghost.pop(key, False) is None:
            self._main[key] = 0
        else:
            self._small[key] = 0

    def _hit(self, key: Key, info: BlockInfo) -> None:
        queue = self._small if key in self._small else self._main
        queue[key] = min(queue[key] + 1, MAX_FREQUENCY)

    def _evict(self) -> Key:
        while True:
            if self._small and (len(self._small) >= self.small_capacity or not self._main):
                key, uses = self._small.popitem(last=False)
                if uses == 0:
                    self._remember(key)
                    return key
                self._main[key] = 0
            else:
                key, uses = self._main.popitem(last=False)
                if uses == 0:
                    return key
                self._main[key] = uses - 1

    def _forget(self, key: Key) -> None:
        if self._small.pop(key, None) is None:
            del self._main[key]

    def _remember(self, key: Key) -> None:
        self._ghost[key] = None
        while len(self._ghost) > self._ghost_capacity:
            self._ghost.popitem(last=False)
