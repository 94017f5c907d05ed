"""Rollout acts and the budget each is held to.

A rollout is a sequence of tier configurations on one workload (GPU only, +CPU, +cold), an
*act*; several acts may share the segments (``kvtier demo`` runs two, naming their phases
``agentic/...`` and ``chat/...``). Each act's newest configuration is checked against its own
budget: the recommendation's rollback rule for the act whose baseline it was computed from
(``RollbackRule.baseline_tier_config``), else the budget the act's own rollout held it to
(``ROLLOUTS/*.json``, as the demo writes them: ``{"act", "phases": [{"tiers": {"config_id"},
"action", "budget": {"ttft_p99_s", "itl_p99_s", ...}}]}``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvtier.policy.recommend.values import RollbackRule


def act_of(tier_config: str) -> str:
    """The act a tier configuration belongs to: its name up to the last ``/`` (``""``: none)."""
    head, slash, _ = tier_config.rpartition("/")
    return head + slash


@dataclass(frozen=True)
class PhaseDecision:
    """One phase of a recorded rollout: its configuration, the rule's action on it and the
    budget it was held to (``itl_p99_s`` ``None``: TTFT only)."""

    tier_config: str
    action: str
    ttft_p99_s: float
    itl_p99_s: float | None = None


@dataclass(frozen=True)
class ActRollout:
    act: str
    phases: tuple[PhaseDecision, ...]


@dataclass(frozen=True)
class ActBudget:
    """The budget an act's newest configuration is checked against, and where it is from
    (``source``: ``"recommendation"`` or ``"rollout"``; ``baseline``: the configuration that
    set it, when known)."""

    act: str
    ttft_p99_s: float
    itl_p99_s: float | None
    source: str
    baseline: str | None = None
    decided: str | None = None  # the rollout's own action on the newest phase, if recorded


@dataclass(frozen=True)
class BudgetCheck:
    act: str
    tier_config: str
    metric: str  # "ttft" or "itl"
    value_ms: float
    budget_ms: float
    budget: ActBudget

    @property
    def over(self) -> bool:
        return self.value_ms > self.budget_ms


def load_rollouts(folder: Path) -> tuple[ActRollout, ...]:
    """The recorded rollouts under ``folder`` (none when it is missing); a malformed file
    raises ``ValueError`` naming it."""
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return tuple(_rollout(path) for path in files)


def _rollout(path: Path) -> ActRollout:
    try:
        doc = json.loads(path.read_text())
        act = doc["act"]
        phases = tuple(PhaseDecision(p["tiers"]["config_id"], p["action"], _seconds(p["budget"]["ttft_p99_s"]),
                                     _seconds(p["budget"].get("itl_p99_s"), optional=True))
                       for p in doc["phases"] if p.get("budget"))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"rollout file {path}: not a rollout record ({type(error).__name__}: {error}); "
                         "expected {\"act\", \"phases\": [{\"tiers\": {\"config_id\"}, \"action\", "
                         "\"budget\": {\"ttft_p99_s\", ...}}]}") from None
    if not isinstance(act, str):
        raise ValueError(f"rollout file {path}: 'act' must be a string, got {act!r}")
    return ActRollout(act, phases)


def _seconds(value, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"a budget must be a positive number of seconds, got {value!r}")
    return float(value)


def act_budgets(tier_configs: Sequence[str], rule: RollbackRule | None,
                rollouts: Sequence[ActRollout]) -> dict[str, ActBudget | None]:
    """Each act (in rollout order) with the budget its newest configuration answers to, or
    ``None`` when nothing records one. A rule without a recorded baseline belongs to the
    act only when the data holds one act."""
    acts = list(dict.fromkeys(act_of(c) for c in tier_configs))
    recorded = {r.act: r for r in rollouts}
    rule_act = act_of(rule.baseline_tier_config) if rule is not None and rule.baseline_tier_config \
        else (acts[0] if rule is not None and len(acts) == 1 else None)
    budgets: dict[str, ActBudget | None] = {}
    for act in acts:
        newest = [c for c in tier_configs if act_of(c) == act][-1]
        own = recorded.get(act)
        decision = next((p for p in reversed(own.phases) if p.tier_config == newest), None) if own else None
        if rule is not None and act == rule_act:
            budgets[act] = ActBudget(act, rule.ttft_p99_s, rule.itl_p99_s, "recommendation",
                                     rule.baseline_tier_config, decision.action if decision else None)
        elif decision is not None:
            baseline = own.phases[0].tier_config if own.phases else None
            budgets[act] = ActBudget(act, decision.ttft_p99_s, decision.itl_p99_s, "rollout", baseline,
                                     decision.action)
        else:
            budgets[act] = None
    return budgets


def budget_checks(p99: pd.DataFrame, tier_configs: Sequence[str],
                  budgets: dict[str, ActBudget | None]) -> list[BudgetCheck]:
    """The newest configuration of each budgeted act against its budget, from
    ``request_latency``'s p99 rows (``tier_config``, ``metric``, ``latency_ms``)."""
    checks = []
    measured = [c for c in tier_configs if c in set(p99["tier_config"])]
    for act, budget in budgets.items():
        mine = [c for c in measured if act_of(c) == act]
        if budget is None or not mine:
            continue
        newest = mine[-1]
        for metric, budget_s in (("ttft", budget.ttft_p99_s), ("itl", budget.itl_p99_s)):
            row = p99[(p99["tier_config"] == newest) & (p99["metric"] == metric)]
            if budget_s is not None and not row.empty:
                checks.append(BudgetCheck(act, newest, metric, float(row["latency_ms"].iloc[0]),
                                          budget_s * 1000, budget))
    return checks
