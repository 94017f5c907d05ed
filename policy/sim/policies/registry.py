"""The one registry of eviction policies: what ``kvtier simulate --policy``, ``kvtier
evaluate``, :class:`SimConfig`, the flows and the tests read.

Each entry is a :class:`PolicySpec`: the policy's class (a compiled :class:`KeyedTier` or a
:class:`CachePolicy` written in Python), the semantics it runs under as ``SimConfig.policy``,
and whether ``evaluate`` compares it as a CPU-tier policy. A Python policy joins with
:func:`register_policy` (see ``policy/README.md``); the flows drive it through the core's
Python-tier adapter, so it replays one to two orders of magnitude slower than a compiled one.
A module that registers policies is named on the command line with ``--policy-module``
(:func:`load_policy_modules`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass

from kvtier.policy.sim.policies.base import CachePolicy
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


@dataclass(frozen=True)
class PolicySpec:
    """One registered policy.

    * ``cls``: built with ``cls(capacity_blocks)``; a :class:`KeyedTier` runs compiled, a
      :class:`CachePolicy` subclass through the Python-tier adapter;
    * ``semantics``: the ``SimConfig.semantics`` it may be ``policy`` of (``exclusive``: every
      tier; ``vllm``: vLLM's CPU tier, request-scoped; ``trtllm``: the engine's own order);
    * ``vllm_cls``: its request-scoped form as vLLM's CPU tier (compiled policies only);
    * ``evaluate``: a CPU-tier row ``kvtier evaluate`` accepts;
    * ``summary``: one line for help texts.
    """

    cls: type
    summary: str
    semantics: tuple[str, ...] = ("exclusive",)
    vllm_cls: type | None = None
    evaluate: bool = True

    @property
    def name(self) -> str:
        return self.cls.name

    @property
    def compiled(self) -> bool:
        return issubclass(self.cls, KeyedTier)

    @property
    def uses_future(self) -> bool:
        return bool(self.cls.uses_future)


# A compiled policy joins with its class in ``sim/_policies.pxi`` and one line here, e.g.
# ``PolicySpec(compiled_policy("clock", "Clock"), "CLOCK")``, and an oracle under
# ``tests/policy/sim/oracle/policies/``.
POLICIES: dict[str, PolicySpec] = {spec.name: spec for spec in (
    PolicySpec(LRU, "least recently used", ("exclusive", "vllm"), vllm_cls=VllmLRU),
    PolicySpec(ARC, "adaptive replacement cache", ("exclusive", "vllm"), vllm_cls=VllmARC),
    PolicySpec(S3FIFO, "S3-FIFO (libCacheSim's)"),
    PolicySpec(PriorityLRU, "TensorRT-LLM's priority LRU", ("exclusive", "trtllm"),
               evaluate=False),
    PolicySpec(Belady, "Belady's MIN, the offline bound (needs the future)"),
)}


def register_policy(cls: type, summary: str, *, evaluate: bool = True) -> type:
    """Register a :class:`CachePolicy` subclass under ``cls.name``; returns ``cls``.

    It runs under ``exclusive`` semantics in every tier, and as vLLM's CPU tier too when it
    is ``request_scoped`` (it must then evict around protected blocks). ``ValueError`` for a
    class that is not a ``CachePolicy`` or a name already taken.
    """
    if not (isinstance(cls, type) and issubclass(cls, CachePolicy)):
        raise ValueError(f"register_policy takes a CachePolicy subclass, got {cls!r}")
    name = cls.name
    if not isinstance(name, str) or not name or name == CachePolicy.name:
        raise ValueError(f"{cls.__name__} needs its own class attribute `name`, got {name!r}")
    if name in POLICIES:
        raise ValueError(f"eviction policy {name!r} is already registered "
                         f"({POLICIES[name].cls.__qualname__}); choose another name")
    semantics = ("exclusive", "vllm") if cls.request_scoped else ("exclusive",)
    POLICIES[name] = PolicySpec(cls, summary, semantics, evaluate=evaluate)
    return cls


def load_policy_modules(modules: Iterable[str]) -> None:
    """Import each module by name, so the policies it registers join :data:`POLICIES`;
    ``ValueError`` naming a module that cannot be imported."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(f"policy module {module!r} cannot be imported ({error}); "
                             f"name a module on the Python path") from None


def policy_names(semantics: str | None = None, *, evaluate: bool | None = None,
                 compiled: bool | None = None) -> tuple[str, ...]:
    """Registered names, in registration order, filtered by what a caller needs."""
    return tuple(name for name, spec in POLICIES.items()
                 if (semantics is None or semantics in spec.semantics)
                 and (evaluate is None or spec.evaluate == evaluate)
                 and (compiled is None or spec.compiled == compiled))


def make_policy(name: str, capacity_blocks: int | None) -> CachePolicy:
    """A fresh policy by registry name; ``ValueError`` naming the allowed names otherwise."""
    return policy_spec(name).cls(capacity_blocks)


def policy_spec(name: str) -> PolicySpec:
    """The registered entry for ``name``; ``ValueError`` naming the allowed names otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; allowed: "
                         f"{', '.join(POLICIES)}") from None
