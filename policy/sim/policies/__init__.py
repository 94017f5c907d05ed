"""Eviction policies behind one tier protocol (:class:`CachePolicy`), plus admission wrappers.

The built-in policies are compiled (``keyed.py``: the core's tiers addressed by key);
:class:`CachePolicy` is the base for policies written in Python. ``make_policy(name,
capacity_blocks)`` is the registry; names are :data:`POLICIES`.
"""

from __future__ import annotations

from kvtier.policy.sim.policies.admission import (
    Admitted,
    Admitter,
    OfferCountAdmitter,
    PriorityAdmitter,
    ScoreAdmitter,
)
from kvtier.policy.sim.policies.base import NEVER, BlockInfo, CachePolicy
from kvtier.policy.sim.policies.keyed import (
    ARC,
    LRU,
    S3FIFO,
    Belady,
    KeyedTier,
    PriorityLRU,
    VllmARC,
    VllmLRU,
)

POLICIES: dict[str, type[KeyedTier]] = {
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
    "KeyedTier",
    "OfferCountAdmitter",
    "PriorityAdmitter",
    "PriorityLRU",
    "ScoreAdmitter",
    "VllmARC",
    "VllmLRU",
    "make_policy",
]


def make_policy(name: str, capacity_blocks: int | None) -> CachePolicy:
    """A fresh policy by registry name; ``ValueError`` naming the allowed names otherwise."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; allowed: {', '.join(POLICIES)}") from None
    return cls(capacity_blocks)
