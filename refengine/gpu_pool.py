"""The GPU tier: a fixed pool of KV block slots on the compute device, with a prefix cache.

A slot is *free* (no data), *cached* (holds a full block under its hash) or *private* (a
partial block of one running sequence). Cached slots carry a reference count; those at
zero stay cached and are the only eviction candidates. Feasibility (:meth:`available`) is
separate from mutation (:meth:`take_free`, :meth:`evict`).
"""

from __future__ import annotations

from collections import deque

import torch

from kvtier.refengine.eviction import EvictionOrder


class GpuPool:
    def __init__(self, num_blocks: int, block_shape: tuple[int, ...], dtype, device, policy: str):
        self.data = torch.zeros((num_blocks, *block_shape), dtype=dtype, device=device)
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self._slot_of: dict[int, int] = {}
        self._hash_of: dict[int, int] = {}
        self._order = EvictionOrder(policy)

    # ---- queries
    def slot_of(self, block_hash: int) -> int | None:
        return self._slot_of.get(block_hash)

    def available(self, keeping: set[int] = frozenset()) -> int:
        """Slots obtainable now: free ones plus unreferenced cached ones not in ``keeping``."""
        idle = sum(1 for h, s in self._slot_of.items() if self._refs[s] == 0 and h not in keeping)
        return len(self._free) + idle

    @property
    def cached_hashes(self) -> list[int]:
        return list(self._order)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    # ---- mutations
    def take_free(self) -> int | None:
        """A free slot (referenced once, uncached), or ``None`` when only eviction would help."""
        if not self._free:
            return None
        slot = self._free.popleft()
        self._refs[slot] = 1
        return slot

    def victim(self) -> int | None:
        """The cached, unreferenced block eviction would remove next (not removed yet)."""
        return self._order.victim(lambda h: self._refs[self._slot_of[h]] == 0)

    def evict(self, block_hash: int) -> int:
        """Uncache ``block_hash`` and hand its slot to the caller (referenced once)."""
        slot = self._slot_of.pop(block_hash)
        del self._hash_of[slot]
        self._order.remove(block_hash)
        self._refs[slot] = 1
        return slot

    def cache(self, slot: int, block_hash: int) -> bool:
        """Register a full private block under its hash; ``False`` if the hash is cached already."""
        if block_hash in self._slot_of:
            return False
        self._slot_of[block_hash] = slot
        self._hash_of[slot] = block_hash
        self._order.add(block_hash)
        return True

    def ref(self, block_hash: int) -> int:
        slot = self._slot_of[block_hash]
        self._refs[slot] += 1
        self._order.touch(block_hash)
        return slot

    def release(self, slot: int) -> None:
        """Drop one reference; an uncached slot at zero goes back to the free list."""
        self._refs[slot] -= 1
        block_hash = self._hash_of.get(slot)
        if block_hash is not None:
            self._order.touch(block_hash)
        elif self._refs[slot] == 0:
            self._free.append(slot)

    def clear(self) -> list[int]:
        """Uncache every unreferenced block; returns their hashes (for eviction events)."""
        gone = [h for h in self._order if self._refs[self._slot_of[h]] == 0]
        for block_hash in gone:
            slot = self.evict(block_hash)
            self.release(slot)
        return gone
