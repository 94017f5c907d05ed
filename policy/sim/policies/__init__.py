"""Eviction policies behind one tier protocol (:class:`CachePolicy`), plus admission wrappers.

The built-in policies are compiled (``keyed.py``: the core's tiers addressed by key,
:func:`compiled_policy` the face of one);
:class:`CachePolicy` is the base for policies written in Python. ``make_policy(name,
capacity_blocks)`` builds one by name; the names and what each needs are
:data:`POLICIES` (``registry.py``), where :func:`register_policy` adds one written in Python.
"""

from __future__ import annotations

from kvtier.policy.sim.policies.admission import (
    Admitted,
    Admitter,
    OfferCountAdmitter,
    PriorityAdmitter,
    ScoreAdmitter,
    SightingAdmitter,
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
    compiled_policy,
)
from kvtier.policy.sim.policies.registry import (
    POLICIES,
    PolicySpec,
    load_policy_modules,
    make_policy,
    policy_names,
    policy_spec,
    register_policy,
)

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
    "PolicySpec",
    "PriorityAdmitter",
    "PriorityLRU",
    "ScoreAdmitter",
    "SightingAdmitter",
    "VllmARC",
    "VllmLRU",
    "compiled_policy",
    "load_policy_modules",
    "make_policy",
    "policy_names",
    "policy_spec",
    "register_policy",
]

