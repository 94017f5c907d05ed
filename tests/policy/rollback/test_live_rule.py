"""The live rollback rule, one evaluation instant at a time: when it pauses, when it resumes,
and why it cannot flap; and that it fires where the recorded rule does."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.collector.events import RequestRecord
from kvtier.policy.rollback.decide import decide
from kvtier.policy.rollback.live_rule import GuardrailSettings, LiveRule
from kvtier.policy.rollback.rule import LatencyBudget

BUDGET = LatencyBudget(ttft_p99_s=1.0, itl_p99_s=0.1, sustained_s=10, window_s=5)
SETTINGS = GuardrailSettings(mode="act", budget=BUDGET, step_s=1.0, hold_s=20, max_hold_s=80)


def run(rule: LiveRule, start_s: float, end_s: float, ttft, itl=0.01, every_s=0.25):
    """Requests finishing every ``every_s`` from ``start_s`` to ``end_s`` (TTFT ``ttft(t)``),
    the rule evaluated each second; returns its decisions."""
    decisions = []
    t = start_s
    for second in np.arange(start_s, end_s, 1.0):
        while t < second + 1.0:
            value = ttft(t) if callable(ttft) else ttft
            if value is not None:
                rule.observe(t, value, itl)
            t += every_s
        decision = rule.evaluate(second + 1.0)
        if decision is not None:
            decisions.append(decision)
    return decisions


def test_a_sustained_breach_pauses_within_its_interval_and_one_step():
    rule = LiveRule(SETTINGS)
    assert run(rule, 0, 30, 0.2) == []
    (pause,) = run(rule, 30, 60, 1.5)
    assert pause.action == "pause" and pause.reason == "ttft_p99_over_budget"
    assert 40 <= pause.time_s <= 42  # over budget from 31 s, held for 10 s
    assert pause.ttft_p99_s == pytest.approx(1.5) and pause.budget_s == 1.0
    assert pause.hold_s == 20 and rule.paused


def test_a_spike_shorter_than_the_interval_does_not_pause():
    rule = LiveRule(SETTINGS)
    assert run(rule, 0, 60, lambda t: 3.0 if 20 <= t < 24 else 0.2) == []


def test_inter_token_latency_pauses_on_its_own_budget():
    rule = LiveRule(SETTINGS)
    (pause,) = run(rule, 0, 30, 0.2, itl=0.3)
    assert pause.reason == "itl_p99_over_budget" and pause.budget_s == 0.1


def test_a_pause_holds_then_resumes_once_every_p99_stays_below_the_hysteresis_line():
    rule = LiveRule(SETTINGS)
    (pause,) = run(rule, 0, 20, 1.5)
    # within budget but above 0.8 x budget: the pause holds however long it lasts
    assert run(rule, 20, 80, 0.9) == [] and rule.paused
    (resume,) = run(rule, 80, 120, 0.5)
    assert resume.action == "resume" and resume.reason == "within_budget"
    assert 94 <= resume.time_s <= 96  # clear once the 5 s window drains (85 s), held 10 s


def test_the_hold_outlasts_the_all_clear():
    rule = LiveRule(SETTINGS)
    (pause,) = run(rule, 0, 15, 1.5)
    (resume,) = run(rule, 15, 60, 0.2)
    assert resume.time_s >= pause.time_s + 20  # clear after ~16 s, but the hold is 20 s


def test_silence_is_no_evidence_a_pause_holds_until_requests_show_the_budget_kept():
    rule = LiveRule(SETTINGS)
    run(rule, 0, 15, 1.5)
    assert run(rule, 15, 60, None) == [] and rule.paused  # nothing finishes: stuck, or idle
    (resume,) = run(rule, 60, 90, 0.2)
    assert resume.action == "resume" and 70 <= resume.time_s <= 72  # clear from 61 s, for 10 s


def test_a_tier_still_slow_after_a_trial_resume_pauses_again_for_twice_as_long():
    rule = LiveRule(SETTINGS)
    holds, t = [], 0
    # the tier is slow whenever it serves: p99 over budget while resumed, fine while paused
    for _ in range(4):
        decisions = run(rule, t, t + 200, lambda s: 0.2 if rule.paused else 1.5)
        t += 200
        holds += [d.hold_s for d in decisions if d.action == "pause"]
    assert holds[:4] == [20, 40, 80, 80]  # doubled each time, up to max_hold_s


def test_a_pause_long_after_the_last_resume_holds_for_the_base_time():
    rule = LiveRule(SETTINGS)
    run(rule, 0, 15, 1.5)
    run(rule, 15, 60, 0.2)  # resumed
    run(rule, 60, 200, 0.2)  # well within budget for longer than max_hold_s
    (pause,) = run(rule, 200, 230, 1.5)
    assert pause.hold_s == 20


def test_an_operators_state_is_adopted_with_fresh_clocks():
    rule = LiveRule(SETTINGS)
    run(rule, 0, 8, 1.5)  # breaching for 7 s
    rule.set_paused(True, 8.0)
    assert rule.status().paused and rule.status().breaching_since_s is None
    rule.set_paused(False, 9.0)
    (pause,) = run(rule, 9, 30, 1.5)
    assert pause.time_s >= 19  # the breach clock started again at the operator's resume


def test_the_live_rule_fires_where_the_recorded_rule_does():
    slow_from = 40.0
    records = [RequestRecord(f"r{i}", arrival_s=i * 0.5, prompt_tokens=10, itl_s=0.01,
                             ttft_s=1.4 if i * 0.5 >= slow_from else 0.3) for i in range(200)]
    (recorded,) = decide(records, BUDGET, step_s=1.0)
    rule = LiveRule(SETTINGS)
    for r in records:  # observed at arrival, as the recorded rule windows them
        rule.observe(r.arrival_s, r.ttft_s, r.itl_s)
    live = next(d for t in np.arange(0.0, 120.0, 1.0) if (d := rule.evaluate(t)) is not None)
    assert live.time_s == recorded.breaches[0].fired_at_s


@pytest.mark.parametrize("change, message", [
    ({"mode": "loud"}, "mode must be one of off, observe, act"),
    ({"resume_ratio": 1.5}, "resume_ratio"), ({"hold_s": 0}, "hold_s"),
    ({"hold_s": 100, "max_hold_s": 50}, "max_hold_s")])
def test_settings_name_the_bad_value(change, message):
    with pytest.raises(ValueError, match=message):
        GuardrailSettings(**change)
