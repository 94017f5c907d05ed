"""Adaptive Replacement Cache (Megiddo & Modha, FAST'03), as a :class:`CachePolicy`.

T1 holds keys seen once, T2 keys seen again; ghost lists B1/B2 remember recent victims of
each. A miss that hits a ghost shifts the target size ``p`` of T1 toward the list that would
have kept it. Differences from the paper, all due to tiers removing keys from the outside:
room is made only when the cache is actually full, and a T1-only full cache evicts from T1
into B1 (the paper deletes it outright); ghost lists are then trimmed to the paper's bounds.
"""

from __future__ import annotations

from collections import OrderedDict

from kvtier.policy.sim.policies.base import BlockInfo, CachePolicy, Key


class ARC(CachePolicy):
    """Adaptive recency/frequency balance with ghost lists; ``p`` is T1's target size."""

    name = "arc"

    def __init__(self, capacity_blocks: int | None) -> None:
        super().__init__(capacity_blocks)
        self.p = 0.0
        self._t1: OrderedDict = OrderedDict()
        self._t2: OrderedDict = OrderedDict()
        self._b1: OrderedDict = OrderedDict()
        self._b2: OrderedDict = OrderedDict()
        self._incoming_from_b2 = False

    def _before_insert(self, key: Key, info: BlockInfo) -> None:
        c = self.capacity_blocks
        self._incoming_from_b2 = key in self._b2
        if c is None:
            return
        if key in self._b1:
            self.p = min(c, self.p + max(len(self._b2) / len(self._b1), 1.0))
        elif key in self._b2:
            self.p = max(0.0, self.p - max(len(self._b1) / len(self._b2), 1.0))
        elif len(self._t1) + len(self._b1) >= c and self._b1:
            self._b1.popitem(last=False)
        elif len(self._t1) + len(self._t2) + len(self._b1) + len(self._b2) >= 2 * c and self._b2:
            self._b2.popitem(last=False)

    def _store(self, key: Key, info: BlockInfo) -> None:
        if self._b1.pop(key, False) is None or self._b2.pop(key, False) is None:
            self._t2[key] = None
        else:
            self._t1[key] = None
        self._trim_ghosts()

    def _hit(self, key: Key, info: BlockInfo) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        else:
            self._t2.move_to_end(key)

    def _evict(self) -> Key:
        t1 = len(self._t1)
        take_t1 = t1 > 0 and (t1 > self.p or (self._incoming_from_b2 and t1 == self.p)
                              or not self._t2)
        if take_t1:
            key = self._t1.popitem(last=False)[0]
            self._b1[key] = None
        else:
            key = self._t2.popitem(last=False)[0]
            self._b2[key] = None
        return key

    def _forget(self, key: Key) -> None:
        if self._t1.pop(key, False) is False:
            del self._t2[key]

    def _trim_ghosts(self) -> None:
        c = self.capacity_blocks
        while self._b1 and len(self._t1) + len(self._b1) > c:
            self._b1.popitem(last=False)
        while self._b2 and len(self) + len(self._b1) + len(self._b2) > 2 * c:
            self._b2.popitem(last=False)
