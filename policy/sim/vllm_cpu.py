"""vLLM 0.33's CPU offloading tier, modelled call for call (``CPUOffloadingManager`` with its
``lru`` and ``arc`` cache policies), so the simulator's vLLM flow evicts what vLLM evicts.

Per request: ``begin``; ``load`` the prefix hits (they count as reuses); ``store`` the newly
computed blocks (all-or-nothing: if the victims cannot be found among blocks outside the offer,
nothing is stored); ``finish`` applies the request's recency once, head to tail.

* LRU: each block has a rank; the lowest goes first. Blocks a request touches get the
  request's provisional rank ``(request, -position)`` (tails before heads), and at ``finish``
  fresh ranks tail to head, so a request's head outlives its tail.
* ARC: inserts go to T1; at ``finish`` a reused block moves T1 -> T2 (or to T2's MRU end), an
  insertion-only block to the MRU end of its list; a store miss found in ghost list B1 (B2)
  raises (lowers) T1's target; eviction takes from T1 while ``len(T1) >= int(target)``, else
  from T2, each falling back to the other, and ghost lists are trimmed to the capacity.
* ``store_threshold`` >= 2: a block is stored once it has been offered that many times, with
  offers counted in a bounded tracker that never drops the keys of the current offer.

A test checks per-request hits equal vLLM's own manager on the same block streams.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from policy.sim.vllm_policies import VllmARC, VllmLRU

KeyPos = tuple[int, int]  # (block hash, position in the prompt)
CORES = {"lru": VllmLRU, "arc": VllmARC}


class VllmCpuTier:
    """The CPU tier: residency, per-request access bookkeeping, and the store threshold."""

    def __init__(self, capacity_blocks: int | None, policy: str = "lru",
                 store_threshold: int = 0, max_tracked: int = 64000) -> None:
        if policy not in CORES:
            raise ValueError(f"policy must be one of {', '.join(CORES)}, got {policy!r}")
        self.capacity_blocks = capacity_blocks
        self.core = CORES[policy](capacity_blocks)
        self.store_threshold = store_threshold
        self.max_tracked = max_tracked
        self._offers: OrderedDict | None = OrderedDict() if store_threshold >= 2 else None
        self.begin()

    def __contains__(self, key: int) -> bool:
        return key in self.core

    def __len__(self) -> int:
        return len(self.core)

    def __iter__(self):
        return iter(self.core.keys())

    def begin(self) -> None:
        """Start a request's bookkeeping."""
        self._positions: dict[int, int] = {}
        self._inserted: set[int] = set()
        self._reused: set[int] = set()
        self._store_missed: set[int] = set()
        self.core.new_request()

    def load(self, keys: Sequence[KeyPos]) -> None:
        """The request reads these resident blocks (prefix hits or promotions)."""
        self._record(keys, reused=[k for k, _ in keys])

    def store(self, keys: Sequence[KeyPos], *, threshold: bool = True
              ) -> tuple[list[int], list[int]] | None:
        """Offer newly computed blocks; returns ``(stored, evicted)``, or ``None`` when room
        could not be made (nothing stored). ``threshold=False`` skips the store threshold
        (a promotion slot)."""
        if self._offers is not None and threshold:
            self._count_offers([k for k, _ in keys])
        to_store = [(k, p) for k, p in keys if k not in self.core]
        existing = [k for k, _ in keys if k in self.core]
        if self._offers is not None and threshold:
            to_store = [(k, p) for k, p in to_store if self._offers.get(k, 0) >= self.store_threshold]
        misses = [k for k, _ in to_store if k not in self._store_missed]
        if misses:
            self.core.on_store_miss(misses)
            self._store_missed.update(misses)
        recorded = {k for k, _ in to_store} | set(existing)
        self._record([(k, p) for k, p in keys if k in recorded], reused=existing)
        if not to_store:
            return [], []
        victims: list[int] = []
        free = None if self.capacity_blocks is None else self.capacity_blocks - len(self.core)
        if free is not None and len(to_store) > free:
            found = self.core.evict(len(to_store) - free, {k for k, _ in keys})
            if found is None:
                return None
            victims = found
        for key, position in to_store:
            self.core.insert(key, position)
            self._inserted.add(key)
        return [k for k, _ in to_store], victims

    def finish(self) -> None:
        """Apply the request's recency (head to tail), once."""
        order = sorted(self._positions, key=self._positions.__getitem__)
        self.core.finish(order, self._inserted - self._reused, self._reused)
        self.begin()

    def _record(self, keys: Sequence[KeyPos], reused: Sequence[int]) -> None:
        new = [(k, p) for k, p in keys if k not in self._positions]
        for key, position in new:
            self._positions[key] = position
        if new:
            self.core.on_access(new)
        self._reused.update(k for k in reused if k not in self._inserted)

    def _count_offers(self, keys: list[int]) -> None:
        offers = self._offers
        protected = set()
        for key in keys:
            if key in offers:
                offers.move_to_end(key)
                offers[key] += 1
                protected.add(key)
        unprotected = len(offers) - len(protected)
        for key in keys:
            if key in offers:
                continue
            if len(offers) >= self.max_tracked:
                if unprotected == 0:
                    continue
                offers.popitem(last=False)
                unprotected -= 1
            offers[key] = 1
