"""The eviction cores of vLLM 0.33's CPU tier (see ``vllm_cpu.py`` for the semantics)."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence


class VllmLRU:
    """Ranked LRU: lowest rank first; a lazy heap of ``(rank, key)``."""

    def __init__(self, capacity_blocks: int | None) -> None:
        self._ranks: dict[int, tuple[int, int]] = {}
        self._heap: list = []
        self._next_rank = 0
        self._request_rank: int | None = None

    def __contains__(self, key: int) -> bool:
        return key in self._ranks

    def __len__(self) -> int:
        return len(self._ranks)

    def keys(self):
        return self._ranks.keys()

    def new_request(self) -> None:
        self._request_rank = None

    def _rank_of_request(self) -> int:
        if self._request_rank is None:
            self._next_rank += 1
            self._request_rank = self._next_rank
        return self._request_rank

    def _set(self, key: int, rank: tuple[int, int]) -> None:
        self._ranks[key] = rank
        heapq.heappush(self._heap, (rank, key))

    def on_access(self, keys: Sequence[tuple[int, int]]) -> None:
        request = self._rank_of_request()
        for key, position in keys:
            rank = (request, -position)
            if key in self._ranks and self._ranks[key] < rank:
                self._set(key, rank)

    def on_store_miss(self, keys: Iterable[int]) -> None:
        return None  # misses are not resident: a touch changes nothing

    def insert(self, key: int, position: int) -> None:
        self._set(key, (self._rank_of_request(), -position))

    def finish(self, head_to_tail: Sequence[int], insertion_only: set, reused: set) -> None:
        for key in reversed(head_to_tail):
            if key in self._ranks:
                self._next_rank += 1
                self._set(key, (self._next_rank, 0))

    def evict(self, n: int, protected: set) -> list[int] | None:
        chosen, deferred, seen = [], [], set()
        while self._heap and len(chosen) < n:
            rank, key = heapq.heappop(self._heap)
            if self._ranks.get(key) != rank or key in seen:
                continue  # stale entry
            seen.add(key)
            (deferred if key in protected else chosen).append((rank, key))
        for entry in deferred:
            heapq.heappush(self._heap, entry)
        if len(chosen) < n:
            for entry in chosen:
                heapq.heappush(self._heap, entry)
            return None
        for _, key in chosen:
            del self._ranks[key]
        return [key for _, key in chosen]


class VllmARC:
    """ARC as vLLM's ``ARCCachePolicy`` runs it (request-scoped recency)."""

    def __init__(self, capacity_blocks: int | None) -> None:
        self.capacity = capacity_blocks
        self.target_t1 = 0.0
        self.t1: OrderedDict = OrderedDict()
        self.t2: OrderedDict = OrderedDict()
        self.b1: OrderedDict = OrderedDict()
        self.b2: OrderedDict = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def keys(self):
        return [*self.t1, *self.t2]

    def new_request(self) -> None:
        return None

    def on_access(self, keys) -> None:
        return None

    def on_store_miss(self, keys: Sequence[int]) -> None:
        capacity = self.capacity if self.capacity is not None else float("inf")
        for key in reversed(keys):
            if key in self.b1:
                self.target_t1 = min(self.target_t1 + max(1, len(self.b2) / len(self.b1)), capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target_t1 = max(self.target_t1 - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def insert(self, key: int, position: int) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def finish(self, head_to_tail: Sequence[int], insertion_only: set, reused: set) -> None:
        for key in reversed(head_to_tail):
            if key in insertion_only:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused and key in self.t1:
                del self.t1[key]
                self.t2[key] = None
            elif key in reused and key in self.t2:
                self.t2.move_to_end(key)

    def evict(self, n: int, protected: set) -> list[int] | None:
        t1 = (k for k in self.t1 if k not in protected)
        t2 = (k for k in self.t2 if k not in protected)
        chosen: list[tuple[int, bool]] = []
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
            chosen.append((key, from_t1))
        for key, from_t1 in chosen:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghost in (self.b1, self.b2):
            while self.capacity is not None and len(ghost) > self.capacity:
                ghost.popitem(last=False)
        return [key for key, _ in chosen]
