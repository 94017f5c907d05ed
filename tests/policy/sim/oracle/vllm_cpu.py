"""vLLM 0.33's CPU offloading tier, modelled call for call (``CPUOffloadingManager``), so the
simulator's vLLM flow evicts what vLLM evicts.

Per request: ``begin``; ``load`` the prefix hits (they count as reuses); ``store`` the newly
computed blocks; ``finish`` applies the request's recency once (the core's ``finish``).

* The eviction core is a request-scoped tier (``policy/sim/vllm_policies.py``: ``lru``, ``arc``).
* ``store`` is all-or-nothing: blocks already resident count as reuses; if the victims for
  the new ones cannot be found among blocks outside the offer, nothing is stored.
* ``store_threshold`` >= 2: a block is stored once it has been offered that many times
  (:class:`kvtier.policy.sim.policies.OfferCountAdmitter`, vLLM's rule, counting a request's blocks
  as one offer).

A test checks per-request hits equal vLLM's own manager on the same block streams.
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.policy.sim.oracle import BlockInfo, OfferCountAdmitter
from tests.policy.sim.oracle.vllm_policies import VllmARC, VllmLRU

KeyPos = tuple[int, int]  # (block hash, position in the prompt)
CORES = {"lru": VllmLRU, "arc": VllmARC}


class VllmCpuTier:
    """The CPU tier: a request-scoped core, vLLM's store rules, and the store threshold."""

    def __init__(self, capacity_blocks: int | None, policy: str = "lru",
                 store_threshold: int = 0, max_tracked: int = 64000) -> None:
        if policy not in CORES:
            raise ValueError(f"policy must be one of {', '.join(CORES)}, got {policy!r}")
        self.capacity_blocks = capacity_blocks
        self.core = CORES[policy](capacity_blocks)
        self.threshold = OfferCountAdmitter(store_threshold, max_tracked)
        self.begin()

    def __contains__(self, key: int) -> bool:
        return key in self.core

    def __len__(self) -> int:
        return len(self.core)

    def __iter__(self):
        return iter(self.core.keys())

    def begin(self) -> None:
        """Start a request's bookkeeping."""
        self._store_missed: set[int] = set()
        self.core.begin()

    def load(self, keys: Sequence[KeyPos]) -> None:
        """The request reads these blocks (prefix hits or promotions); one a staged cold hit
        evicted since it was found is no longer there to read."""
        for key, position in keys:
            if key in self.core:
                self.core.touch(key, BlockInfo(position=position))

    def store(self, keys: Sequence[KeyPos], *, threshold: bool = True
              ) -> tuple[list[int], list[int]] | None:
        """Offer newly computed blocks; returns ``(stored, evicted)``, or ``None`` when room
        could not be made (nothing stored). ``threshold=False`` skips the store threshold
        (a promotion slot)."""
        gated = threshold and self.threshold.counting
        if gated:
            self.threshold.offer([k for k, _ in keys])
        to_store = []
        for key, position in keys:
            if key in self.core:
                self.core.touch(key, BlockInfo(position=position))  # stored before: a reuse
            elif not gated or self.threshold.passes(key):
                to_store.append((key, position))
        misses = [k for k, _ in to_store if k not in self._store_missed]
        if misses:
            self.core.on_miss(misses)
            self._store_missed.update(misses)
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
            self.core.insert(key, BlockInfo(position=position))
        return [k for k, _ in to_store], victims

    def finish(self) -> None:
        """Apply the request's recency (head to tail), once."""
        self.core.finish()
        self.begin()
