"""TensorRT-LLM's prioritized LRU: retention priorities 0..100, LRU inside a priority.

Every block of the lowest non-empty priority is evicted before any block of a higher one;
within a priority the least recently used goes first. A use re-queues the block at the
priority its new request gives it (the engine sets priorities when a request releases blocks).
"""

from __future__ import annotations

from collections import OrderedDict

from kvtier.collector.events import PRIORITY_MAX, PRIORITY_MIN
from kvtier.policy.sim.policies.base import BlockInfo, CachePolicy, Key


class PriorityLRU(CachePolicy):
    """One LRU queue per priority level."""

    name = "priority"
    reads_info = True

    def __init__(self, capacity_blocks: int | None) -> None:
        super().__init__(capacity_blocks)
        self._queues: dict[int, OrderedDict] = {}
        self._priority_of: dict = {}

    def _store(self, key: Key, info: BlockInfo) -> None:
        priority = info.priority
        if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            raise ValueError(f"priority must be in {PRIORITY_MIN}..{PRIORITY_MAX}, got {priority}")
        self._priority_of[key] = priority
        self._queues.setdefault(priority, OrderedDict())[key] = None

    def _hit(self, key: Key, info: BlockInfo) -> None:
        self._forget(key)
        self._store(key, info)

    def _evict(self) -> Key:
        lowest = min(self._queues)
        key = self._queues[lowest].popitem(last=False)[0]
        if not self._queues[lowest]:
            del self._queues[lowest]
        del self._priority_of[key]
        return key

    def _forget(self, key: Key) -> None:
        priority = self._priority_of.pop(key)
        queue = self._queues[priority]
        del queue[key]
        if not queue:
            del self._queues[priority]
