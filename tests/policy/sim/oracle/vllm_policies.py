"""The eviction cores of vLLM 0.33's CPU tier (``CPUOffloadingManager`` with its ``lru`` and
``arc`` cache policies), as request-scoped tiers of the one tier protocol (see
``policy/sim/policies/base.py``; ``vllm_cpu.py`` has the tier's store rules).

During a request, ``touch`` records a reuse (a load, or a block a store found resident) and
``insert`` a store, each with the block's position in the prompt; ``finish`` applies the
request's recency once, head to tail, as vLLM does when the request finishes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from kvtier.policy.sim.policies.base import DEFAULT_INFO, BlockInfo, CachePolicy, Key
from tests.policy.sim.oracle.policies.lru import LRU


class _RequestScoped(CachePolicy):
    """What both cores share: residency, capacity, and room made by :meth:`evict`."""

    request_scoped = True

    def insert(self, key: Key, info: BlockInfo = DEFAULT_INFO) -> list[Key]:
        if key in self._resident:
            self.touch(key, info)
            return []
        if self.capacity_blocks == 0:
            return []
        victims: list[Key] = []
        if self.capacity_blocks is not None and len(self._resident) >= self.capacity_blocks:
            victims = self.evict(len(self._resident) - self.capacity_blocks + 1) or []
            if not victims:
                return []
        self._resident.add(key)
        self._store(key, info)
        return victims

    def pop_victim(self) -> Key:
        victims = self.evict(1)
        if not victims:
            raise KeyError("pop_victim from an empty cache")
        return victims[0]

    def evict(self, n: int, protected: Collection[Key] = ()) -> list[Key] | None:
        """The first ``n`` blocks outside ``protected`` in eviction order, all or nothing."""
        chosen = self._choose(n, protected)
        if chosen is None:
            return None
        for key in chosen:
            self._resident.remove(key)
            self._forget(key)
        self._evicted(chosen)
        return chosen

    def _choose(self, n: int, protected: Collection[Key]) -> list[Key] | None:
        raise NotImplementedError

    def _evicted(self, keys: list[Key]) -> None:
        """After ``keys`` were evicted (ARC remembers them in its ghost lists)."""


class VllmLRU(_RequestScoped):
    """vLLM's LRU. Each block has a rank and the lowest goes first; a request's blocks take the
    provisional rank (request, -position) and, at finish, fresh ranks tail to head, so a
    request's head outlives its tail. Every provisional rank is above every finished one, so
    the order is one LRU of finished blocks followed by the running request's blocks by
    descending position."""

    name = "vllm-lru"

    def __init__(self, capacity_blocks: int | None) -> None:
        super().__init__(capacity_blocks)
        self._finished = LRU(None)                 # lowest rank first
        self._running: dict[Key, int] = {}         # this request's blocks -> position

    def _hit(self, key: Key, info: BlockInfo) -> None:
        if key in self._finished:
            self._finished.remove(key)
            self._running[key] = info.position

    def _store(self, key: Key, info: BlockInfo) -> None:
        self._running[key] = info.position

    def _forget(self, key: Key) -> None:
        if self._running.pop(key, None) is None:
            self._finished.remove(key)

    def _choose(self, n: int, protected: Collection[Key]) -> list[Key] | None:
        chosen = []
        for key in self._in_rank_order():
            if len(chosen) == n:
                break
            if key not in protected:
                chosen.append(key)
        return chosen if len(chosen) == n else None

    def _in_rank_order(self):
        yield from self._finished.order()
        yield from sorted(self._running, key=self._running.__getitem__, reverse=True)

    def finish(self) -> None:
        for key in sorted(self._running, key=self._running.__getitem__, reverse=True):
            self._finished.insert(key)
        self._running.clear()

    def keys(self):
        return list(self._in_rank_order())


class VllmARC(_RequestScoped):
    """ARC as vLLM's ``ARCCachePolicy`` runs it. Stores go to T1; at finish a reused block
    moves T1 -> T2 (or to T2's MRU end), an insertion-only block to the MRU end of its list; a
    store miss found in ghost list B1 (B2) raises (lowers) T1's target; eviction takes from T1
    while ``len(T1) >= int(target)``, else from T2, each falling back to the other, and ghost
    lists are trimmed to the capacity."""

    name = "vllm-arc"

    def __init__(self, capacity_blocks: int | None) -> None:
        super().__init__(capacity_blocks)
        self.target_t1 = 0.0
        self.t1: OrderedDict = OrderedDict()
        self.t2: OrderedDict = OrderedDict()
        self.b1: OrderedDict = OrderedDict()
        self.b2: OrderedDict = OrderedDict()
        self._positions: dict[Key, int] = {}  # this request's blocks, first position seen
        self._inserted: set = set()
        self._reused: set = set()
        self._ghost_of: dict = {}  # chosen victim -> the ghost list it goes to

    def _note(self, key: Key, position: int) -> None:
        self._positions.setdefault(key, position)

    def _hit(self, key: Key, info: BlockInfo) -> None:
        self._note(key, info.position)
        if key not in self._inserted:
            self._reused.add(key)

    def _store(self, key: Key, info: BlockInfo) -> None:
        self._note(key, info.position)
        self._inserted.add(key)
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def _forget(self, key: Key) -> None:
        if self.t1.pop(key, False) is False:
            del self.t2[key]

    def on_miss(self, keys: Sequence[Key]) -> None:
        capacity = self.capacity_blocks if self.capacity_blocks is not None else float("inf")
        for key in reversed(keys):
            if key in self.b1:
                self.target_t1 = min(self.target_t1 + max(1, len(self.b2) / len(self.b1)), capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target_t1 = max(self.target_t1 - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def finish(self) -> None:
        order = sorted(self._positions, key=self._positions.__getitem__)  # head to tail
        insertion_only = self._inserted - self._reused
        for key in reversed(order):
            if key in insertion_only:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in self._reused and key in self.t1:
                del self.t1[key]
                self.t2[key] = None
            elif key in self._reused and key in self.t2:
                self.t2.move_to_end(key)
        self._positions, self._inserted, self._reused = {}, set(), set()

    def _choose(self, n: int, protected: Collection[Key]) -> list[Key] | None:
        self._ghost_of.clear()
        t1 = (k for k in self.t1 if k not in protected)
        t2 = (k for k in self.t2 if k not in protected)
        chosen: list[Key] = []
        virtual_t1 = len(self.t1)
        for _ in range(n):
            key, from_t1 = None, False
            if virtual_t1 >= int(self.target_t1):
                key = next(t1, None)
                from_t1 = key is not None
            if key is None:
                key = next(t2, None)
            if key is None:
                key = next(t1, None)
                from_t1 = True
                if key is None:
                    return None
            if from_t1:
                virtual_t1 -= 1
            chosen.append(key)
            self._ghost_of[key] = self.b1 if from_t1 else self.b2
        return chosen

    def _evicted(self, keys: list[Key]) -> None:
        for key in keys:
            self._ghost_of.pop(key)[key] = None
        self._ghost_of.clear()
        for ghost in (self.b1, self.b2):
            while self.capacity_blocks is not None and len(ghost) > self.capacity_blocks:
                ghost.popitem(last=False)

    def keys(self):
        return [*self.t1, *self.t2]
