"""Eviction policies behind one protocol (:class:`CachePolicy`), plus admission wrappers.

``make_policy(name, capacity_blocks)`` is the registry; names are :data:`POLICIES`.
"""

from __future__ import annotations

from policy.sim.policies.admission import (
    Admitted,
    Admitter,
    OfferCountAdmitter,
    PriorityAdmitter,
    ScoreAdmitter,
)
from policy.sim.policies.arc import ARC
from policy.sim.policies.base import NEVER, BlockInfo, CachePolicy
from policy.sim.policies.belady import Belady
from policy.sim.policies.lru import LRU
from policy.sim.policies.priority import PriorityLRU
from policy.sim.policies.s3fifo import S3FIFO

POLICIES: dict[str, type[CachePolicy]] = {
    "lru": LRU, "arc": ARC, "s3fifo": S3FIFO, "priority": PriorityLRU, "belady": Belady,
}

__all__ = [
    "ARC",
    "LRU",
    "NEVER",
    "POLICIES",
    "S3FIFO",
    "Admitted",
    "Admitter",
    "Belady",
    "BlockInfo",
    "CachePolicy",
    "OfferCountAdmitter",
    "PriorityAdmitter",
    "PriorityLRU",
    "ScoreAdmitter",
    "make_policy",
]


def make_policy(name: str, capacity_blocks: int | None) -> CachePolicy:
    """A fresh policy by registry name; ``ValueError`` naming the allowed names otherwise."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; allowed: {', '.join(POLICIES)}") from None
    return cls(capacity_blocks)
