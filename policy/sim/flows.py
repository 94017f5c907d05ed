"""How blocks move between the GPU, CPU and cold tiers (see ``SimConfig`` for the three
semantics): one factory per semantics builds a compiled flow with all its tiers.

A caller that brings its own CPU tier (``cpu_tier``: a policy of the tier protocol, in an
:class:`Admitted` if it has an admitter) or admitter (``cpu_admitter``) passes it to the
factory; nothing is patched afterwards. Built-in policies and admitters run compiled; a tier
or admitter written in Python runs through the core's adapters (slower), and one that knows
its compiled form says so with ``compiled_for(flow)``.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvtier.policy.sim.compiled import core
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.policies import (
    Admitted,
    BlockInfo,
    KeyedTier,
    OfferCountAdmitter,
    PriorityAdmitter,
    policy_spec,
)

TIERS = (0, 1, 2)  # GPU, CPU, cold, as the core numbers them (kvtier.collector.events.Tier values)


class TierView:
    """One tier of a compiled flow, by block hash: ``in``, ``len``, ``iter``."""

    def __init__(self, flow, tier: int) -> None:
        self._flow = flow
        self._tier = tier

    def __contains__(self, key) -> bool:
        return isinstance(key, int) and self._flow.contains(self._tier, key)

    def __iter__(self) -> Iterator[int]:
        return iter(self._flow.members(self._tier))

    def __len__(self) -> int:
        return len(self._flow.members(self._tier))


class FlowView:
    """A compiled flow's tiers by hash (``gpu``, ``cpu``, ``cold``; ``None``: no such tier)
    and the compiled flow itself (``compiled``)."""

    def __init__(self, flow, present: tuple[bool, bool, bool]) -> None:
        self.compiled = flow
        self.gpu, self.cpu, self.cold = (TierView(flow, t) if on else None
                                         for t, on in zip(TIERS, present))


def _rule(config: SimConfig):
    rule = config.priorities
    return core().PriorityRule(rule.default_priority, rule.prefix_blocks, rule.prefix_priority)


def _policy(name: str, capacity: int | None, interner):
    """The registered policy ``name`` as a compiled tier (a Python one behind the adapter)."""
    return compiled_tier(policy_spec(name).cls(capacity), interner)[0]


def _vllm_cpu(name: str, capacity: int | None, interner):
    """vLLM's CPU tier running the registered policy ``name`` (its request-scoped form)."""
    spec = policy_spec(name)
    return compiled_tier((spec.vllm_cls or spec.cls)(capacity), interner)[0]


def compiled_tier(tier, interner):
    """The compiled tier and admitter for a caller's CPU tier."""
    admitter = None
    if isinstance(tier, Admitted):
        tier, admitter = tier.policy, tier.admitter
    if isinstance(tier, KeyedTier):
        compiled = tier.compiled()
    elif hasattr(tier, "compiled_tier"):
        compiled = tier.compiled_tier(interner)
    else:
        compiled = core().PyTier(tier, BlockInfo, interner)
    return compiled, admitter


def compiled_admitter(admitter, interner):
    """The compiled form of an admitter (``None`` stays ``None``)."""
    if admitter is None:
        return None
    c = core()
    if hasattr(admitter, "compiled_admitter"):
        return admitter.compiled_admitter(interner)
    if isinstance(admitter, OfferCountAdmitter):
        return admitter.compiled()
    if isinstance(admitter, PriorityAdmitter):
        return c.PriorityGate(admitter.min_priority, admitter.comparison == "gt")
    return c.PyAdmitter(admitter, BlockInfo, bool(getattr(admitter, "reads_info", True)))


def runs_compiled(tier) -> bool:
    """Whether a tier (maybe an :class:`Admitted`) has a compiled form for every part, so a
    compiled flow drives it without calling back into Python."""
    if isinstance(tier, Admitted):
        admitter = tier.admitter
        known = (isinstance(admitter, (OfferCountAdmitter, PriorityAdmitter))
                 or hasattr(admitter, "compiled_admitter"))
        return known and runs_compiled(tier.policy)
    return isinstance(tier, KeyedTier) or hasattr(tier, "compiled_tier")


def _gpu_filter(config: SimConfig):
    """The GPU prefix cache's sighting filter (``config.gpu_sightings``), or ``None``."""
    return core().SightingFilter(config.gpu_sightings) if config.gpu_sightings else None


def _chained(admitter) -> bool:
    return bool(getattr(admitter, "chained", False))


def exclusive_flow(config: SimConfig, cpu_tier=None, cpu_admitter=None, offers=None
                   ) -> FlowView:
    """Every tier runs ``config.policy``; GPU victims pass ``cpu_admitter`` (default: the
    store threshold, when >= 2) into the CPU tier; ``config.gpu_sightings`` filters what the
    GPU tier keeps of a request's fresh blocks. ``cpu_tier`` replaces the CPU tier whole;
    ``offers`` (an ``OfferObserver``: the learned kernels' ``OfferLog``) records what the CPU
    tier is offered."""
    c = core()
    interner = c.Interner()
    admitter = cpu_admitter
    if cpu_tier is not None:
        if admitter is not None:
            raise ValueError("pass the admitter inside cpu_tier (Admitted(policy, admitter))")
        cpu, admitter = compiled_tier(cpu_tier, interner)
    else:
        cpu = (_policy(config.policy, config.cpu_blocks, interner) if config.cpu_blocks != 0
               else None)
        if admitter is None and config.store_threshold >= 2:
            admitter = OfferCountAdmitter(config.store_threshold)
    cold = (_policy(config.policy, config.cold_blocks, interner) if config.cold_blocks != 0
            else None)
    flow = c.ExclusiveFlow(_policy(config.policy, config.gpu_blocks, interner), cpu, cold,
                           compiled_admitter(admitter, interner) if cpu is not None else None,
                           rule=_rule(config),
                           track_parents=_chained(admitter) or _chained(cpu_tier),
                           offers=offers, interner=interner,
                           gpu_filter=_gpu_filter(config))
    _bind(flow, cpu)
    return FlowView(flow, (True, cpu is not None, cold is not None))


def trtllm_flow(config: SimConfig, cpu_tier=None, cpu_admitter=None, offers=None
               ) -> FlowView:
    """TensorRT-LLM: priority LRU in both tiers, GPU victims gated by priority into host;
    only leaves are evicted, so a request's GPU blocks are released tail first."""
    _no_cpu_tier(config, cpu_tier, offers)
    c = core()
    interner = c.Interner()
    cpu, gate = None, None
    if config.cpu_blocks != 0:
        cpu = c.PriorityLru(config.cpu_blocks)
        gate = compiled_admitter(cpu_admitter or PriorityAdmitter(
            config.offload_min_priority, config.offload_comparison), interner)
    flow = c.ExclusiveFlow(c.PriorityLru(config.gpu_blocks), cpu, None, gate,
                           rule=_rule(config), tail_first=True,
                           track_parents=_chained(cpu_admitter), interner=interner)
    return FlowView(flow, (True, cpu is not None, False))


def vllm_flow(config: SimConfig, cpu_tier=None, cpu_admitter=None, offers=None
             ) -> FlowView:
    """vLLM's OffloadingConnector: vLLM's GPU block pool, write-through to vLLM's CPU tier
    (``config.policy``: ``lru`` or ``arc``) gated by ``cpu_admitter`` then store_threshold,
    every CPU store cascading to the cold (file) tier. ``cpu_tier``, when given, is a
    request-scoped tier of the protocol (an out-of-tree vLLM cache policy's twin)."""
    c = core()
    interner = c.Interner()
    cpu = None
    if cpu_tier is not None and getattr(cpu_tier, "request_scoped", False) and offers is None:
        cpu, _ = compiled_tier(cpu_tier, interner)
    else:
        _no_cpu_tier(config, cpu_tier, offers)
    if cpu is None and config.cpu_blocks != 0:
        cpu = _vllm_cpu(config.policy, config.cpu_blocks, interner)
    cold = c.Lru(config.cold_blocks) if config.cold_blocks != 0 else None
    flow = c.VllmFlow(c.GpuPool(config.gpu_blocks), cpu, cold,
                      c.StoreThreshold(config.store_threshold),
                      compiled_admitter(cpu_admitter, interner), rule=_rule(config),
                      track_parents=_chained(cpu_admitter), interner=interner,
                      gpu_filter=_gpu_filter(config))
    return FlowView(flow, (True, cpu is not None, cold is not None))


def _no_cpu_tier(config: SimConfig, cpu_tier, offers=None) -> None:
    if offers is not None:
        raise ValueError(f"offer logs work with semantics 'exclusive' only, not "
                         f"{config.semantics!r}")
    if cpu_tier is not None:
        raise ValueError(f"semantics {config.semantics!r} builds its own CPU tier; "
                         f"cpu_tier works with 'exclusive' (and a request-scoped tier with "
                         f"'vllm') only")


def _bind(flow, tier) -> None:
    bind = getattr(tier, "bind", None)
    if bind is not None:
        bind(flow)


FLOWS = {"exclusive": exclusive_flow, "vllm": vllm_flow, "trtllm": trtllm_flow}


def build_flow(config: SimConfig, *, cpu_tier=None, cpu_admitter=None, offers=None
               ) -> FlowView:
    """The compiled flow for ``config.semantics``, built whole by its factory."""
    return FLOWS[config.semantics](config, cpu_tier, cpu_admitter, offers)
