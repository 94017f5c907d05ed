"""The rollback rule: p99 over a window above budget for a sustained interval, per config."""

from __future__ import annotations

import pytest

from kvtier.collector.events import RequestRecord
from kvtier.policy.rollback.rule import LatencyBudget
from kvtier.policy.rollback.decide import decide

BUDGET = LatencyBudget(ttft_p99_s=1.0, itl_p99_s=0.1, sustained_s=60, window_s=30)


def requests(config, start_s, end_s, ttft_s, itl_s=0.01, every_s=1.0):
    n = int((end_s - start_s) / every_s)
    return [RequestRecord(request_id=f"{config}-{i}", arrival_s=start_s + i * every_s,
                          prompt_tokens=10, ttft_s=ttft_s(start_s + i * every_s)
                          if callable(ttft_s) else ttft_s, itl_s=itl_s, tier_config_id=config)
            for i in range(n)]


def test_a_sustained_breach_rolls_the_newest_tier_back():
    records = requests("gpu", 0, 300, 0.5) + requests("gpu+cpu", 300, 600, 1.5)
    gpu, cpu = decide(records, BUDGET, step_s=5)
    assert not gpu.fired and gpu.action() == "keep"
    assert cpu.fired and cpu.rollback_to == "gpu"
    (breach,) = cpu.breaches
    assert breach.metric == "ttft" and breach.worst_p99_s == pytest.approx(1.5)
    assert 360 <= breach.fired_at_s <= 370  # breach from ~300 s, held for 60 s
    assert "return to gpu" in cpu.action()


def test_a_short_spike_does_not_fire():
    spike = lambda t: 3.0 if 400 <= t < 420 else 0.2
    records = requests("gpu", 0, 300, 0.5) + requests("gpu+cpu", 300, 600, spike)
    assert [d.fired for d in decide(records, BUDGET, step_s=5)] == [False, False]


def test_inter_token_latency_fires_on_its_own_budget():
    records = requests("gpu", 0, 200, 0.5) + requests("gpu+cpu", 200, 500, 0.5, itl_s=0.3)
    _, cpu = decide(records, BUDGET)
    assert [b.metric for b in cpu.breaches] == ["itl"]


def test_the_first_configuration_has_nothing_to_return_to():
    (only,) = decide(requests("gpu", 0, 300, 5.0), BUDGET)
    assert only.fired and only.rollback_to is None and "investigate" in only.action()


def test_gaps_without_requests_reset_the_sustained_clock():
    # 20 s bursts over budget, 80 s apart: a 30 s window holds each for under 60 s, then
    # empties (no value, no breach), so the clock restarts with every burst
    records = [r for k in range(5) for r in requests("cpu", k * 100, k * 100 + 20, 2.0)]
    assert not decide(records, BUDGET)[0].fired
    # the same requests without the silences breach for longer than 60 s and fire
    assert decide(requests("cpu", 0, 100, 2.0), BUDGET)[0].fired


def test_step_must_be_positive():
    with pytest.raises(ValueError, match="step_s"):
        decide([], BUDGET, step_s=0)
