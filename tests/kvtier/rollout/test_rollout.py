"""The rollout: phases in order, the file tier only when justified, the rollback rule stops it."""

from __future__ import annotations

import json

import pytest

from kvtier.collector.events import RequestRecord
from kvtier.policy.rollback.rule import LatencyBudget
from kvtier.rollout.plan import PhaseTiers, RolloutPlan
from kvtier.rollout.runner import OperatorSwitcher, run_rollout

pytestmark = pytest.mark.timeout(120)


class RecordingSwitcher:
    def __init__(self):
        self.applied = []

    def apply(self, tiers):
        self.applied.append(tiers.config_id)


def looping_trace(prompts: int, blocks: int, rounds: int) -> list[RequestRecord]:
    """``prompts`` distinct prompts of ``blocks`` blocks, sent round-robin ``rounds`` times:
    each prompt's blocks come back after all the others, a reuse distance of prompts x blocks."""
    records = []
    for i in range(prompts * rounds):
        p = i % prompts
        records.append(RequestRecord(f"r{i}", float(i), blocks * 16, 4,
                                     block_hashes=tuple(1000 * p + b for b in range(blocks)), block_size_tokens=16))
    return records


def phase_of(ttft_s: float, span_s: float = 60.0, n: int = 120):
    def run_phase(tiers):
        start = {"gpu-only": 0.0, "gpu+cpu": 1000.0, "gpu+cpu+file": 2000.0}[tiers.config_id]
        return [RequestRecord(f"{tiers.config_id}-{i}", start + i * span_s / n, 64, 4, ttft_s=ttft_s, itl_s=0.01,
                              gpu_hit_tokens=0, cpu_promotion_tokens=32 if tiers.cpu_blocks else 0,
                              cold_promotion_tokens=0, recomputed_tokens=32 if tiers.cpu_blocks else 64,
                              tier_config_id=tiers.config_id) for i in range(n)], 0
    return run_phase


def test_phases_run_in_order_and_compare_hit_quality():
    switcher = RecordingSwitcher()
    plan = RolloutPlan(gpu_blocks=8, cpu_blocks=64, cold_blocks=256, min_cold_gain=0.0)
    report = run_rollout(plan, switcher, phase_of(0.05), block_tokens=16)
    assert switcher.applied == ["gpu-only", "gpu+cpu", "gpu+cpu+file"]
    shares = [p.summary["shares"]["cpu_promotion"] for p in report.phases]
    assert shares == [0.0, 0.5, 0.5]
    assert all(p.action == "keep" for p in report.phases)
    assert report.phases[0].summary["ttft_s"]["p99"] == pytest.approx(0.05)


def test_file_tier_is_skipped_when_it_would_not_pay(monkeypatch):
    switcher = RecordingSwitcher()
    plan = RolloutPlan(gpu_blocks=8, cpu_blocks=64, cold_blocks=256, min_cold_gain=0.05)
    # The CPU phase's requests never come back: a file tier cannot serve anything.
    report = run_rollout(plan, switcher, phase_of(0.05), block_tokens=16)
    assert switcher.applied == ["gpu-only", "gpu+cpu"]
    assert report.skipped[0][0] == "gpu+cpu+file"
    assert "retention value too low" in report.skipped[0][1]


def test_file_tier_runs_when_the_simulator_shows_the_gain():
    from kvtier.rollout.plan import cold_tier_gain

    plan = RolloutPlan(gpu_blocks=8, cpu_blocks=64, cold_blocks=512, min_cold_gain=0.05)
    # 20 prompts x 8 blocks come back every 160 blocks: too far for GPU+CPU (72), near enough with the file tier.
    assert cold_tier_gain(looping_trace(20, 8, 4), plan, 16) > 0.5


def test_a_phase_over_budget_is_rolled_back_and_ends_the_rollout():
    switcher = RecordingSwitcher()
    budget = LatencyBudget(ttft_p99_s=0.5, itl_p99_s=1.0, sustained_s=10, window_s=5)
    plan = RolloutPlan(gpu_blocks=8, cpu_blocks=64, cold_blocks=256, min_cold_gain=0.0, budget=budget)
    fast, slow = phase_of(0.1), phase_of(2.0)
    report = run_rollout(plan, switcher, lambda tiers: (slow if tiers.cpu_blocks else fast)(tiers), block_tokens=16)
    assert switcher.applied == ["gpu-only", "gpu+cpu"]
    assert report.phases[0].action == "keep"
    assert report.phases[1].action == "disable the newest tier: return to gpu-only"
    assert report.phases[1].rolled_back


def test_operator_switcher_writes_the_tiers_and_waits(tmp_path):
    confirmations = []
    path = tmp_path / "next.json"
    switcher = OperatorSwitcher(lambda tiers: (path.write_text(json.dumps(tiers.to_dict())), str(path))[1],
                                confirmations.append)
    switcher.apply(PhaseTiers("gpu+cpu", 48, 256))
    assert json.loads(path.read_text())["cpu_blocks"] == 256
    assert "gpu+cpu" in confirmations[0] and str(path) in confirmations[0]


def test_plan_validates_capacities():
    with pytest.raises(ValueError, match="capacities"):
        RolloutPlan(gpu_blocks=0)
    with pytest.raises(ValueError, match="min_cold_gain"):
        RolloutPlan(min_cold_gain=1.5)
