"""Least recently used: the default of vLLM's prefix cache and CPU tier, LMCache and SGLang.

The one LRU core of the simulator: the tiers of every flow, vLLM's request-scoped CPU LRU and
the store-threshold offer tracker keep their order in it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from kvtier.policy.sim.policies.base import BlockInfo, CachePolicy, Key


class LRU(CachePolicy):
    """Evicts the key whose last use is oldest."""

    name = "lru"

    def __init__(self, capacity_blocks: int | None) -> None:
        super().__init__(capacity_blocks)
        self._order: OrderedDict = OrderedDict()  # oldest first

    def _store(self, key: Key, info: BlockInfo) -> None:
        self._order[key] = None

    def _hit(self, key: Key, info: BlockInfo) -> None:
        self._order.move_to_end(key)

    def _evict(self) -> Key:
        return self._order.popitem(last=False)[0]

    def _forget(self, key: Key) -> None:
        del self._order[key]

    def order(self) -> Iterator[Key]:
        """Resident keys in eviction order, oldest first."""
        return iter(self._order)
