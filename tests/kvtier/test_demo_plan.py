"""The demo's rollout plans: the baseline sets the budget, a tier that makes the tail worse
than it is rolled back, sizes decided after the baseline are the ones tried."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.collector.events import RequestRecord
from kvtier.demo.sized_plan import BUDGET_MARGIN, FixedPlan, SizedPlan, Sizes
from kvtier.rollout.plan import PhaseTiers
from kvtier.rollout.runner import run_rollout
from kvtier.policy.rollback.decide import budget_from_baseline, decide, sustained_p99


class Recording:
    def __init__(self):
        self.applied = []

    def apply(self, tiers):
        self.applied.append(tiers)


def phase(ttft_of, n: int = 200, span_s: float = 20.0, seed: int = 0):
    """A phase runner: ``ttft_of(tiers)`` sets each phase's TTFT scale, jittered."""
    rng = np.random.default_rng(seed)
    starts = {}

    def run_phase(tiers):
        start = starts.setdefault(tiers.config_id, 100.0 * len(starts))
        scale = ttft_of(tiers)
        return [RequestRecord(f"{tiers.config_id}-{i}", start + i * span_s / n, 64, 4,
                              ttft_s=scale * float(rng.uniform(0.5, 1.5)), itl_s=0.01,
                              gpu_hit_tokens=0, cpu_promotion_tokens=0, cold_promotion_tokens=0,
                              recomputed_tokens=64, tier_config_id=tiers.config_id)
                for i in range(n)], 0
    return run_phase


def test_the_baseline_never_breaks_its_own_budget():
    records, _ = phase(lambda t: 0.1)(PhaseTiers("gpu-only", 8))
    budget = budget_from_baseline(records, 1.0, window_s=5, sustained_s=5)
    assert not decide(records, budget, step_s=1.0)[0].fired
    assert budget.ttft_p99_s == pytest.approx(sustained_p99(records, "ttft", 5, 5))
    tighter = budget_from_baseline(records, 1.0, 5, 5)
    tighter = type(tighter)(tighter.ttft_p99_s * 0.95, tighter.itl_p99_s * 2, 5, 5)
    assert decide(records, tighter, step_s=1.0)[0].fired  # just under the level held: it fires


def test_a_tier_that_makes_the_tail_worse_is_rolled_back():
    plan = FixedPlan(8, (PhaseTiers("gpu+cpu", 8, 64), PhaseTiers("gpu+cpu+cold", 8, 64, 256)))
    switcher = Recording()
    report = run_rollout(plan, switcher, phase(lambda t: 0.3 if t.cpu_blocks else 0.1),
                         block_tokens=16)
    assert [p.action for p in report.phases] == ["keep",
                                                 "disable the newest tier: return to gpu-only"]
    assert [t.config_id for t in switcher.applied] == ["gpu-only", "gpu+cpu"]  # stops there
    budget = report.phases[1].budget
    assert budget is report.phases[0].budget
    assert budget.ttft_p99_s == pytest.approx(
        BUDGET_MARGIN * sustained_p99(report.phases[0].records, "ttft", 5, 5))


def test_a_tier_within_the_budget_is_kept():
    plan = FixedPlan(8, (PhaseTiers("gpu+cpu", 8, 64),))
    report = run_rollout(plan, Recording(), phase(lambda t: 0.1), block_tokens=16)
    assert [p.action for p in report.phases] == ["keep", "keep"]


def test_sizes_decided_after_the_baseline_are_the_ones_tried():
    asked = []

    def size(baseline):
        asked.append(baseline.tiers.config_id)
        return Sizes(96, 0, "knee", "no cold tier: nothing left for it")

    switcher = Recording()
    report = run_rollout(SizedPlan(8, size, prefix="a/"), switcher, phase(lambda t: 0.1),
                         block_tokens=16)
    assert asked == ["a/gpu-only"]
    assert [(t.config_id, t.cpu_blocks) for t in switcher.applied] == [("a/gpu-only", 0),
                                                                       ("a/gpu+cpu", 96)]
    assert report.skipped == (("a/gpu+cpu+cold", "no cold tier: nothing left for it"),)
