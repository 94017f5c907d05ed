"""Two rollout acts in one set of segments (as ``kvtier demo`` writes them: ``agentic/...``
then ``chat/...``): each act's newest configuration is checked against its own budget, the
recommendation's rule for the act it was computed from, the act's recorded rollout budget
for the other, never the first act's budget for the second."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvtier.dashboard import rollouts
from kvtier.dashboard.sources import ENV_ROLLOUTS
from kvtier.demo.run import _write_rollout
from kvtier.rollout.plan import PhaseTiers
from kvtier.rollout.runner import PhaseOutcome, RolloutReport
from kvtier.policy.recommend.values import RollbackRule
from kvtier.policy.rollback.rule import LatencyBudget
from tests.dashboard.fixtures import Scenario, build_segments, write_recommendation
from tests.dashboard.test_app import open_page

ACT_ONE = ("agentic/gpu-only", "agentic/gpu+cpu")
ACT_TWO = ("chat/gpu-only", "chat/gpu+cpu")
RULE_TTFT_S = 0.001   # the recommendation's budget: every fixture TTFT is over it
CHAT_TTFT_S = 10.0    # act two's own budget: every fixture TTFT is within it


@pytest.fixture(scope="module")
def two_acts(tmp_path_factory):
    root = tmp_path_factory.mktemp("acts")
    segments = build_segments(root / "segments", Scenario(phases=ACT_ONE + ACT_TWO,
                                                          requests_per_phase=(40, 40, 40, 40)))
    return segments


def _rollout_record(folder, act, phases, ttft_s, action="keep"):
    """The act's rollout written by the demo's own writer."""
    budget = LatencyBudget(ttft_s, 0.5, 5, 5)
    report = RolloutReport(tuple(PhaseOutcome(PhaseTiers(c, 16, 64 if i else 0), (), 0, {}, action, budget)
                                 for i, c in enumerate(phases)))
    _write_rollout(report, act, folder)


def test_each_act_is_checked_against_its_own_budget(monkeypatch, two_acts, tmp_path):
    reco = write_recommendation(tmp_path / "reco", ttft_p99_budget_s=RULE_TTFT_S, baseline="agentic/gpu-only")
    _rollout_record(tmp_path / "rollouts", "agentic/", ACT_ONE, RULE_TTFT_S, action="disable the newest tier")
    _rollout_record(tmp_path / "rollouts", "chat/", ACT_TWO, CHAT_TTFT_S)
    monkeypatch.setenv(ENV_ROLLOUTS, str(tmp_path / "rollouts"))
    at = open_page(monkeypatch, two_acts, "recommendation", recommendation=reco)
    lines = [m.value for m in at.markdown if " p99 " in m.value and "against" in m.value and "\n" not in m.value]
    agentic = [line for line in lines if "`agentic/gpu+cpu` TTFT" in line]
    chat = [line for line in lines if "`chat/gpu+cpu` TTFT" in line]
    assert len(agentic) == 1 and len(chat) == 1, lines
    assert f"against {RULE_TTFT_S * 1e3:.1f} ms (this recommendation's rule, set by `agentic/gpu-only`)" \
        in agentic[0] and "over budget" in agentic[0]
    assert f"against {CHAT_TTFT_S * 1e3:.1f} ms (the budget its own rollout held it to, set by " \
        "`chat/gpu-only`)" in chat[0] and "within budget" in chat[0]
    assert any("The rollout decided on `agentic/gpu+cpu`: disable the newest tier" in c.value for c in at.caption)


def test_a_rule_without_its_act_is_not_applied_to_another_act(monkeypatch, two_acts, tmp_path):
    reco = write_recommendation(tmp_path / "reco", ttft_p99_budget_s=RULE_TTFT_S, baseline="agentic/gpu-only")
    monkeypatch.setenv(ENV_ROLLOUTS, str(tmp_path / "none"))
    at = open_page(monkeypatch, two_acts, "recommendation", recommendation=reco)
    lines = [m.value for m in at.markdown if " p99 " in m.value and "against" in m.value and "\n" not in m.value]
    assert lines and all("`agentic/gpu+cpu`" in line for line in lines), lines
    assert any("No budget recorded for `chat/`" in c.value for c in at.caption)


def test_budgets_per_act_from_rule_and_records():
    rule = RollbackRule(0.3, 300, 120, 0.03, "agentic/gpu-only")
    chat = rollouts.ActRollout("chat/", (rollouts.PhaseDecision("chat/gpu-only", "keep", 0.15, 0.02),
                                         rollouts.PhaseDecision("chat/gpu+cpu", "keep", 0.15, 0.02)))
    configs = list(ACT_ONE + ACT_TWO)
    budgets = rollouts.act_budgets(configs, rule, [chat])
    assert budgets["agentic/"].source == "recommendation" and budgets["agentic/"].ttft_p99_s == 0.3
    assert budgets["chat/"].source == "rollout" and budgets["chat/"].ttft_p99_s == 0.15
    p99 = pd.DataFrame([{"tier_config": c, "metric": m, "latency_ms": 200.0} for c in configs for m in ("ttft", "itl")])
    checks = {(c.tier_config, c.metric): c for c in rollouts.budget_checks(p99, configs, budgets)}
    assert set(checks) == {(c, m) for c in ("agentic/gpu+cpu", "chat/gpu+cpu") for m in ("ttft", "itl")}
    assert not checks[("agentic/gpu+cpu", "ttft")].over and checks[("chat/gpu+cpu", "ttft")].over
    # no baseline recorded: the rule is the data's only act's, or no act's
    assert rollouts.act_budgets(list(ACT_ONE), RollbackRule(0.3, 300, 120), [])["agentic/"].ttft_p99_s == 0.3
    assert set(rollouts.act_budgets(configs, RollbackRule(0.3, 300, 120), []).values()) == {None}
    assert rollouts.act_of("chat/gpu+cpu") == "chat/" and rollouts.act_of("gpu-only") == ""


def test_a_malformed_rollout_record_is_named(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"act": "x/", "phases": [{"budget": {"ttft_p99_s": -1}}]}))
    with pytest.raises(ValueError, match="bad.json"):
        rollouts.load_rollouts(tmp_path)
    assert rollouts.load_rollouts(tmp_path / "missing") == ()
