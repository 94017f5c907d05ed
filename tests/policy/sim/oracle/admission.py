"""The ``store_threshold`` offer counter written in Python: the oracle of the compiled core's
``StoreThreshold`` behind :class:`kvtier.policy.sim.policies.admission.OfferCountAdmitter`, and
the sighting filter counting requests with it (the core's ``SightingFilter``).
The other admitters and the :class:`Admitted` wrapper hold no state the core re-implements, so the
oracle flows use the product's own (re-exported here)."""

from __future__ import annotations

from kvtier.policy.sim.policies.admission import (
    Admitted,
    Admitter,
    PriorityAdmitter,
    ScoreAdmitter,
)
from kvtier.policy.sim.policies.base import BlockInfo, Key
from tests.policy.sim.oracle.policies.lru import LRU

__all__ = ["Admitted", "Admitter", "OfferCountAdmitter", "PriorityAdmitter", "ScoreAdmitter",
           "SightingAdmitter"]


class OfferCountAdmitter:
    """vLLM's ``store_threshold``: a key is stored once it has been offered ``min_offers``
    times (0 or 1: always), as vLLM 0.33's ``CPUOffloadingManager`` counts them.

    Offers are counted in an LRU-bounded tracker of ``max_tracked`` keys (vLLM's
    ``max_tracker_size``, default 64000); a key the tracker forgets starts again, and the keys
    of the offer being counted are never the ones forgotten. An engine offers a request's new
    blocks together (:meth:`offer`); a victim cache offers one block at a time (:meth:`admit`).
    """

    name = "store_threshold"
    reads_info = False

    def __init__(self, min_offers: int, max_tracked: int = 64000) -> None:
        if min_offers < 0 or max_tracked <= 0:
            raise ValueError(f"min_offers must be >= 0 and max_tracked > 0, got "
                             f"{min_offers} and {max_tracked}")
        self.min_offers = min_offers
        self.max_tracked = max_tracked
        self._order = LRU(None)  # least recently offered first
        self._counts: dict = {}

    @property
    def counting(self) -> bool:
        """Whether offers are counted at all (``min_offers`` >= 2)."""
        return self.min_offers >= 2

    def offer(self, keys) -> None:
        """One offer of ``keys``: each tracked key counts once more, each new one starts at 1."""
        if not self.counting:
            return
        order, counts = self._order, self._counts
        counted = set()
        for key in keys:
            if key in order:
                order.touch(key)
                counts[key] += 1
                counted.add(key)
        forgettable = len(order) - len(counted)
        for key in keys:
            if key in order:
                continue
            if len(order) >= self.max_tracked:
                if forgettable == 0:
                    continue
                del counts[order.pop_victim()]
                forgettable -= 1
            order.insert(key)
            counts[key] = 1

    def passes(self, key: Key) -> bool:
        """Whether ``key`` has been offered often enough to be stored."""
        return not self.counting or self._counts.get(key, 0) >= self.min_offers

    def admit(self, key: Key, info: BlockInfo) -> bool:
        self.offer((key,))
        return self.passes(key)


class SightingAdmitter(OfferCountAdmitter):
    """Admit a block on the ``min_sightings``-th request that references it: each request
    counts its blocks once (:meth:`sight`, before it is served) in the offer counter's
    tracker; an offer counts nothing."""

    name = "sightings"

    def sight(self, keys) -> None:
        self.offer(keys)

    def admit(self, key: Key, info: BlockInfo) -> bool:
        return self.passes(key)
