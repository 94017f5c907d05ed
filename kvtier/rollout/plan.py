"""The rollout plan: one cache dimension changes per phase, everything else held fixed.

The seed's sequence: a GPU-only baseline, then a small CPU tier, then a secondary (file) tier
only if retention value justifies it. Whether it does is decided between phases from the
trace itself: a cold promotion must cost less than recomputing the block (``cold_cost``, or
the cost model's defaults), replaying the same requests in the simulator with and without
the file tier must gain at least ``min_cold_gain`` of prompt tokens served from cache
(both checked by :func:`kvtier.policy.recommend.cold_tier.decide`, as ``kvtier recommend`` does for vLLM),
and the CPU phase must not have been rolled back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kvtier.policy.rollback.rule import LatencyBudget
from kvtier.policy.recommend.cold_tier import MIN_COLD_GAIN, ColdCost


@dataclass(frozen=True, slots=True)
class PhaseTiers:
    """A phase's tier configuration, in blocks (the reference engine's ``TierConfig`` fields)."""

    config_id: str
    gpu_blocks: int
    cpu_blocks: int = 0
    cold_blocks: int = 0
    eviction_policy: str = "lru"
    admission_threshold: int = 0

    def __post_init__(self) -> None:
        if self.gpu_blocks < 1 or self.cpu_blocks < 0 or self.cold_blocks < 0:
            raise ValueError(f"phase {self.config_id!r}: capacities must be gpu >= 1, cpu/file >= 0, got "
                             f"{self.gpu_blocks}/{self.cpu_blocks}/{self.cold_blocks}")
        if self.cold_blocks and not self.cpu_blocks:
            raise ValueError(f"phase {self.config_id!r}: a file tier needs a CPU tier (promotions stage through it)")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    """Capacities of the three phases, the latency budget and the file-tier bar."""

    gpu_blocks: int = 48
    cpu_blocks: int = 256
    cold_blocks: int = 1024
    min_cold_gain: float = MIN_COLD_GAIN
    budget: LatencyBudget = field(default_factory=LatencyBudget)
    cold_cost: ColdCost | None = None  # measured; None: the cost model's defaults

    def __post_init__(self) -> None:
        if not 0 <= self.min_cold_gain < 1:
            raise ValueError(f"min_cold_gain must be in [0, 1), got {self.min_cold_gain!r}")
        self.phases()  # validates the capacities

    def phases(self) -> tuple[PhaseTiers, PhaseTiers, PhaseTiers]:
        return (PhaseTiers("gpu-only", self.gpu_blocks),
                PhaseTiers("gpu+cpu", self.gpu_blocks, self.cpu_blocks),
                PhaseTiers("gpu+cpu+file", self.gpu_blocks, self.cpu_blocks, self.cold_blocks))

    # the runner's Plan: the three phases in order, one budget
    def next_phase(self, done, skipped) -> PhaseTiers | None:
        index = len(done) + len(skipped)
        return self.phases()[index] if index < 3 else None

    def skip_reason(self, tiers: PhaseTiers, done, block_tokens: int) -> str | None:
        """The file phase runs only after a kept CPU phase and when the file tier pays."""
        if not tiers.cold_blocks:
            return None
        cpu = next((p for p in done if p.tiers.cpu_blocks and not p.tiers.cold_blocks), None)
        if cpu is None:
            return "the CPU phase did not run"
        from kvtier.policy.cost import CostParams
        from kvtier.policy.recommend.cold_tier import cost_from_params, decide

        gain = cold_tier_gain(cpu.records, self, block_tokens)
        decision = decide(gain, self.min_cold_gain,
                          self.cold_cost or cost_from_params(CostParams(), block_tokens))
        return None if decision.add else decision.reason

    def budget_for(self, done, records) -> LatencyBudget:
        return self.budget


def cold_tier_gain(records, plan: RolloutPlan, block_tokens: int) -> float:
    """Simulated gain in token hit ratio from adding the file tier to the CPU phase.

    ``records`` are the phase's requests as the engine sees them (block ids per engine block).
    """
    from kvtier.policy.sim.config import SimConfig
    from kvtier.policy.sim.simulator import Simulator

    records = list(records)

    def ratio(cold_blocks: int) -> float:
        config = SimConfig(gpu_blocks=plan.gpu_blocks, cpu_blocks=plan.cpu_blocks, cold_blocks=cold_blocks,
                           semantics="exclusive", policy="lru", default_block_tokens=block_tokens)
        return Simulator(config).replay(records).token_hit_ratio

    return ratio(plan.cold_blocks) - ratio(0)
