"""The demo's rollout plans: tiers sized after the baseline, a budget the baseline sets.

Both acts start with the GPU tier alone. Its measured tail sets the budget every later phase
is held to: ``BUDGET_MARGIN`` times the highest p99 TTFT and ITL the baseline sustained for
the rule's interval (:func:`kvtier.policy.rollback.decide.budget_from_baseline`), so the rule keeps a
tier unless it makes the tail clearly worse than running without it. Windows are scaled to
phases that last seconds (production runs the same rule over minutes).

* :class:`SizedPlan` (act one) asks ``size`` for the CPU and cold tiers once the baseline
  has run (the demo runs the recommendation there) and tries each size that is not zero.
* :class:`FixedPlan` (act two) tries given tiers, as an operator copying a setting would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.rollout.plan import PhaseTiers
from kvtier.policy.rollback.rule import LatencyBudget

BUDGET_MARGIN = 1.25
WINDOW_S, SUSTAINED_S = 5, 5


@dataclass(frozen=True)
class Sizes:
    """What the recommendation sized, in engine blocks; a zero size carries its reason."""

    cpu_blocks: int
    cold_blocks: int
    cpu_reason: str = ""
    cold_reason: str = ""


class BaselineBudget:
    """The budget: set from the first phase's own records, then held for every later one."""

    def __init__(self, margin: float = BUDGET_MARGIN, window_s: int = WINDOW_S,
                 sustained_s: int = SUSTAINED_S) -> None:
        self.margin, self.window_s, self.sustained_s = margin, window_s, sustained_s
        self.budget: LatencyBudget | None = None

    def budget_for(self, done: Sequence, records: Sequence) -> LatencyBudget:
        if self.budget is None:
            from kvtier.policy.rollback.decide import budget_from_baseline

            self.budget = budget_from_baseline(records, self.margin, self.window_s,
                                               self.sustained_s)
        return self.budget


class SizedPlan(BaselineBudget):
    """GPU only, then the CPU and cold tiers ``size`` returns after the baseline ran."""

    def __init__(self, gpu_blocks: int, size: Callable[[object], Sizes], prefix: str = "") -> None:
        super().__init__()
        self.gpu_blocks, self.size, self.prefix = gpu_blocks, size, prefix
        self.sizes: Sizes | None = None

    def next_phase(self, done: Sequence, skipped: Sequence) -> PhaseTiers | None:
        tried = len(done) + len(skipped)
        if tried == 0:
            return PhaseTiers(f"{self.prefix}gpu-only", self.gpu_blocks)
        if self.sizes is None:
            self.sizes = self.size(done[0])
        s = self.sizes
        if tried == 1:
            return PhaseTiers(f"{self.prefix}gpu+cpu", self.gpu_blocks, s.cpu_blocks)
        if tried == 2 and s.cpu_blocks:
            return PhaseTiers(f"{self.prefix}gpu+cpu+cold", self.gpu_blocks, s.cpu_blocks,
                              s.cold_blocks)
        return None

    def skip_reason(self, tiers: PhaseTiers, done: Sequence, block_tokens: int) -> str | None:
        if tiers.cpu_blocks == 0 and tiers.config_id.endswith("gpu+cpu"):
            return self.sizes.cpu_reason or "no CPU tier"
        if tiers.config_id.endswith("+cold") and not tiers.cold_blocks:
            return self.sizes.cold_reason or "no cold tier"
        return None


class FixedPlan(BaselineBudget):
    """GPU only, then each of ``tiers`` in order."""

    def __init__(self, gpu_blocks: int, tiers: Sequence[PhaseTiers], prefix: str = "") -> None:
        super().__init__()
        self.phases = (PhaseTiers(f"{prefix}gpu-only", gpu_blocks), *tiers)

    def next_phase(self, done: Sequence, skipped: Sequence) -> PhaseTiers | None:
        tried = len(done) + len(skipped)
        return self.phases[tried] if tried < len(self.phases) else None

    def skip_reason(self, tiers: PhaseTiers, done: Sequence, block_tokens: int) -> str | None:
        return None
