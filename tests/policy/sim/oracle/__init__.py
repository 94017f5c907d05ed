"""The pure-Python reference of the simulator, kept as the oracle the compiled core
(``policy/sim/_core.pyx``) is compared against: the eviction policies (``policies/``, one module
each, found by name), the admitters (``admission.py``), the flows (``flows.py``), vLLM's CPU
tier and cores (``vllm_cpu.py``, ``vllm_policies.py``), its GPU block pool (``vllm_gpu.py``) and
the record-at-a-time simulator (``simulator.py``).

``make_policy(name, capacity_blocks)`` builds one by name; the names are :data:`POLICIES`.
"""

from __future__ import annotations

from tests.policy.sim.oracle.admission import (
    Admitted,
    Admitter,
    OfferCountAdmitter,
    PriorityAdmitter,
    ScoreAdmitter,
    SightingAdmitter,
)
from kvtier.policy.sim.policies.base import NEVER, BlockInfo, CachePolicy
from tests.policy.sim.oracle.policies import POLICIES
from tests.policy.sim.oracle.policies.arc import ARC
from tests.policy.sim.oracle.policies.belady import Belady
from tests.policy.sim.oracle.policies.lru import LRU
from tests.policy.sim.oracle.policies.priority import PriorityLRU
from tests.policy.sim.oracle.policies.s3fifo import S3FIFO

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
    "SightingAdmitter",
    "make_policy",
]


def make_policy(name: str, capacity_blocks: int | None) -> CachePolicy:
    """A fresh policy by registry name; ``ValueError`` naming the allowed names otherwise."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; allowed: {', '.join(POLICIES)}") from None
    return cls(capacity_blocks)
