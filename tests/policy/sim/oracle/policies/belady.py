"""Belady's MIN: evict the block whose next use is farthest in the future (the offline bound).

It needs the future, so the simulator fills :attr:`BlockInfo.next_use` with the global index
of each block's next reference. For uniform block sizes MIN maximises block hits over any
demand-fetching policy. Under prefix-chained ids a parent's next use always precedes its
child's, so MIN keeps the resident set prefix-closed and its hits are prefix-contiguous too.
"""

from __future__ import annotations

import heapq

from kvtier.policy.sim.policies.base import BlockInfo, CachePolicy, Key


class Belady(CachePolicy):
    """Offline MIN over a lazy max-heap of next uses."""

    name = "belady"
    reads_info = True
    uses_future = True

    def __init__(self, capacity_blocks: int | None) -> None:
        super().__init__(capacity_blocks)
        self._next: dict = {}
        self._heap: list = []  # (-next_use, tiebreak, key); stale entries skipped on pop
        self._tiebreak = 0

    def _store(self, key: Key, info: BlockInfo) -> None:
        self._set(key, info.next_use)

    def _hit(self, key: Key, info: BlockInfo) -> None:
        self._set(key, info.next_use)

    def _set(self, key: Key, next_use: float) -> None:
        self._next[key] = next_use
        self._tiebreak += 1
        heapq.heappush(self._heap, (-next_use, self._tiebreak, key))
        if len(self._heap) > 4 * len(self._next) + 1024:  # drop stale entries now and then
            self._heap = [e for e in self._heap if self._next.get(e[2]) == -e[0]]
            heapq.heapify(self._heap)

    def _evict(self) -> Key:
        while True:
            negative_next, _, key = heapq.heappop(self._heap)
            if self._next.get(key) == -negative_next:
                del self._next[key]
                return key

    def _forget(self, key: Key) -> None:
        del self._next[key]  # its heap entries become stale
