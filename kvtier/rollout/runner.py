"""Run the rollout against an endpoint: switch the tiers, drive the same load, compare, decide.

Each phase replays the same slice of the trace with the same load ramp (model, batching and
traffic held fixed), so only the cache dimension differs between phases. Against kvtier's
reference engine the tiers are switched through its ``/admin/tiers`` endpoint; against a real
engine an ``OperatorSwitcher`` writes the next configuration and waits for the operator to
restart the engine. After each phase the rollback rule (``kvtier.policy.rollback.decide``) decides
whether the newest tier must go; a rolled-back phase ends the rollout. What runs next, what
is skipped and the budget come from a :class:`Plan`: :class:`~kvtier.rollout.plan.RolloutPlan`
(three fixed phases, one budget) or one that decides between phases (the demo sizes its
tiers and its budget from what the first phase measured).
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from kvtier.collector import json_text
from kvtier.collector.events import RequestRecord
from kvtier.rollout.plan import PhaseTiers
from kvtier.policy.rollback.rule import LatencyBudget


class Switcher(Protocol):
    """Puts a tier configuration in service; returns when requests will see it."""

    def apply(self, tiers: PhaseTiers) -> None: ...


class EngineAdminSwitcher:
    """Switches kvtier's reference engine through ``POST /admin/tiers`` and waits for it."""

    def __init__(self, endpoint: str, *, timeout_s: float = 60.0, sleep: Callable[[float], None] = time.sleep):
        self.url = endpoint.rstrip("/") + "/admin/tiers"
        self.timeout_s = timeout_s
        self.sleep = sleep

    def apply(self, tiers: PhaseTiers) -> None:
        body = json_text.dumps(tiers.to_dict()).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=10).read()
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            state = json.loads(urllib.request.urlopen(self.url, timeout=10).read())
            if not state.get("switch_pending") and state.get("config_id") == tiers.config_id:
                return
            self.sleep(0.05)
        raise TimeoutError(f"the engine did not take tier configuration {tiers.config_id!r} within {self.timeout_s} s")


class OperatorSwitcher:
    """For a real engine: writes the phase's configuration and waits for the operator."""

    def __init__(self, write: Callable[[PhaseTiers], str], confirm: Callable[[str], None]):
        self.write = write
        self.confirm = confirm

    def apply(self, tiers: PhaseTiers) -> None:
        where = self.write(tiers)
        self.confirm(f"configuration {tiers.config_id!r} written to {where}; restart the engine with it, then continue")


@dataclass(frozen=True)
class PhaseOutcome:
    """What one phase measured (client side), and the rollback rule's verdict on it."""

    tiers: PhaseTiers
    records: tuple[RequestRecord, ...]
    errors: int
    summary: dict
    action: str
    budget: LatencyBudget | None = None  # what the rule checked the phase against

    @property
    def rolled_back(self) -> bool:
        return self.action != "keep"


@dataclass(frozen=True)
class RolloutReport:
    phases: tuple[PhaseOutcome, ...]
    skipped: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (config_id, reason)

    def to_dict(self) -> dict:
        return {"phases": [{"tiers": p.tiers.to_dict(), "requests": len(p.records), "errors": p.errors,
                            "action": p.action, "budget": _budget_dict(p.budget), **p.summary}
                           for p in self.phases],
                "skipped": [{"config_id": c, "reason": r} for c, r in self.skipped]}


def _budget_dict(budget: LatencyBudget | None) -> dict | None:
    if budget is None:
        return None
    return {"ttft_p99_s": budget.ttft_p99_s, "itl_p99_s": budget.itl_p99_s,
            "sustained_s": budget.sustained_s, "window_s": budget.window_s}


RunPhase = Callable[[PhaseTiers], tuple[Sequence[RequestRecord], int]]


class Plan(Protocol):
    """What the runner asks between phases."""

    def next_phase(self, done: Sequence[PhaseOutcome],
                   skipped: Sequence[tuple[str, str]]) -> PhaseTiers | None:
        """The next configuration to try, ``None`` when the rollout is over."""

    def skip_reason(self, tiers: PhaseTiers, done: Sequence[PhaseOutcome],
                    block_tokens: int) -> str | None:
        """Why ``tiers`` should not run (``None``: run it)."""

    def budget_for(self, done: Sequence[PhaseOutcome],
                   records: Sequence[RequestRecord]) -> LatencyBudget:
        """The budget the phase that just measured ``records`` is held to."""


def run_rollout(plan: Plan, switcher: Switcher, run_phase: RunPhase, *,
                block_tokens: int, progress: Callable[[str], None] = lambda line: None,
                after_phase: Callable[[PhaseTiers], None] = lambda tiers: None) -> RolloutReport:
    """Run the phases in order. ``run_phase(tiers)`` drives the load and returns the phase's
    request records (each with ``tier_config_id``) and its error count."""
    from kvtier.policy.rollback.decide import decide

    outcomes: list[PhaseOutcome] = []
    skipped: list[tuple[str, str]] = []
    history: list[RequestRecord] = []
    while (tiers := plan.next_phase(tuple(outcomes), tuple(skipped))) is not None:
        reason = plan.skip_reason(tiers, tuple(outcomes), block_tokens)
        if reason:
            skipped.append((tiers.config_id, reason))
            progress(f"rollout: skipping {tiers.config_id}: {reason}")
            continue
        progress(f"rollout: switching to {tiers.config_id}")
        switcher.apply(tiers)
        records, errors = run_phase(tiers)
        after_phase(tiers)
        history.extend(records)
        budget = plan.budget_for(tuple(outcomes), records)
        verdicts = {d.tier_config_id: d for d in decide(history, budget, step_s=1.0)}
        verdict = verdicts.get(tiers.config_id)
        action = verdict.action() if verdict is not None else "keep"
        outcomes.append(PhaseOutcome(tiers, tuple(records), errors, summarise(records), action,
                                     budget))
        progress(f"rollout: {tiers.config_id}: {len(records)} requests, {errors} errors, {action}")
        if action != "keep":
            break
    return RolloutReport(tuple(outcomes), tuple(skipped))


def summarise(records: Sequence[RequestRecord]) -> dict:
    """Hit quality (shares of prompt tokens per outcome) and latency p50/p95/p99
    (``None`` where no request measured it)."""
    from kvtier.probes.active.stats import percentiles

    tokens = {name: sum(getattr(r, name) or 0 for r in records)
              for name in ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens", "recomputed_tokens")}
    total = sum(tokens.values()) or 1
    out = {"shares": {name.removesuffix("_tokens"): value / total for name, value in tokens.items()}}
    for metric in ("ttft_s", "itl_s", "e2e_latency_s"):
        out[metric] = percentiles([getattr(r, metric) for r in records])
    return out
