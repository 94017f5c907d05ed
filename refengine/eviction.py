"""Eviction order shared by every tier: LRU (a touch moves a block to the back) or FIFO."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterator

from kvtier.refengine.config import EVICTION_POLICIES


class EvictionOrder:
    """Resident block hashes, oldest first. Owns no capacity; tiers ask it for victims."""

    def __init__(self, policy: str):
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"unknown eviction policy {policy!r}; allowed: {', '.join(EVICTION_POLICIES)}")
        self._touch_moves = policy == "lru"
        self._order: OrderedDict[int, None] = OrderedDict()

    def add(self, block_hash: int) -> None:
        self._order[block_hash] = None
        self._order.move_to_end(block_hash)

    def touch(self, block_hash: int) -> None:
        if self._touch_moves and block_hash in self._order:
            self._order.move_to_end(block_hash)

    def remove(self, block_hash: int) -> None:
        self._order.pop(block_hash, None)

    def victim(self, evictable: Callable[[int], bool] = lambda h: True) -> int | None:
        """The first block in eviction order that ``evictable`` allows; ``None`` if none."""
        for block_hash in self._order:
            if evictable(block_hash):
                return block_hash
        return None

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._order
