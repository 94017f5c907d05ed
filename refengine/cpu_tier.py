"""The CPU tier: a fixed pool of host block slots (pinned on CUDA machines), keyed by hash.

``put`` never evicts by itself: the caller asks :meth:`victim`, moves the victim's bytes
where they belong, then :meth:`remove`\\ s it, so eviction stays one decision in one place.
"""

from __future__ import annotations

from collections import deque

from kvtier.refengine.device import host_buffer
from kvtier.refengine.eviction import EvictionOrder


class CpuTier:
    def __init__(self, num_blocks: int, block_shape: tuple[int, ...], dtype, policy: str):
        self.num_blocks = num_blocks
        self.data = host_buffer((num_blocks, *block_shape), dtype)
        self._free: deque[int] = deque(range(num_blocks))
        self._slot_of: dict[int, int] = {}
        self._order = EvictionOrder(policy)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._slot_of

    @property
    def is_full(self) -> bool:
        return not self._free

    @property
    def hashes(self) -> list[int]:
        return list(self._order)

    def get(self, block_hash: int):
        """The block's host tensor (a view into the pool); counts as a use for LRU."""
        self._order.touch(block_hash)
        return self.data[self._slot_of[block_hash]]

    def peek(self, block_hash: int):
        """The block's host tensor without counting a use."""
        return self.data[self._slot_of[block_hash]]

    def victim(self, protected: set[int] = frozenset()) -> int | None:
        """The block eviction would remove next, skipping ``protected`` ones."""
        return self._order.victim(lambda h: h not in protected)

    def remove(self, block_hash: int) -> None:
        self._free.append(self._slot_of.pop(block_hash))
        self._order.remove(block_hash)

    def put(self, block_hash: int, block) -> None:
        """Copy ``block`` (any device) into a free slot. The tier must not be full."""
        if not self._free:
            raise RuntimeError("CpuTier.put on a full tier: evict a victim first")
        slot = self._free.popleft()
        self.data[slot].copy_(block, non_blocking=False)
        self._slot_of[block_hash] = slot
        self._order.add(block_hash)
