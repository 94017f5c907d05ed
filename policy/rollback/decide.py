"""The rollback rule over request records: the offline twin of the Prometheus alerts.

Same budget (:class:`kvtier.policy.rollback.rule.LatencyBudget`) and the same meaning as the
rules ``policy/rollback/alerts.py`` writes: at each evaluation instant ``t`` (every
``step_s``, Prometheus's evaluation interval) the p99 of the requests that arrived in
``(t - window_s, t]`` is compared with the budget, per tier configuration; an empty window
has no value and so is not a breach (``rate()`` over no samples yields nothing). The rule
fires when the breach has held at every instant for ``sustained_s`` (the alert's ``for:``).
A configuration that fired should lose its newest tier: go back to the configuration that
preceded it in the rollout (configurations are ordered by their first request).

One difference is deliberate and documented: the alert interpolates p99 from histogram
buckets, this decision uses the exact p99 of the window's requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.rollback.rule import LatencyBudget
from kvtier.policy.rollback.window import Sustained, window_p99

METRICS = {"ttft": ("ttft_s", "ttft_p99_s"), "itl": ("itl_s", "itl_p99_s")}
UNKNOWN_CONFIG = "unknown"
DEFAULT_BUDGET = LatencyBudget()


@dataclass(frozen=True)
class Breach:
    """A metric that stayed over budget: when the alert would fire, and the worst p99."""

    metric: str
    budget_s: float
    fired_at_s: float
    worst_p99_s: float


@dataclass(frozen=True)
class RollbackDecision:
    """One tier configuration's verdict. ``rollback_to`` is the configuration to return to
    (``None`` when it did not fire, or when it is the first one and nothing precedes it)."""

    tier_config_id: str
    requests: int
    breaches: tuple[Breach, ...]
    rollback_to: str | None

    @property
    def fired(self) -> bool:
        return bool(self.breaches)

    def action(self) -> str:
        if not self.fired:
            return "keep"
        if self.rollback_to is None:
            return "over budget with no earlier configuration to return to: investigate"
        return f"disable the newest tier: return to {self.rollback_to}"

    def to_dict(self) -> dict:
        return {"tier_config_id": self.tier_config_id, "requests": self.requests,
                "fired": self.fired, "action": self.action(), "rollback_to": self.rollback_to,
                "breaches": [b.__dict__ for b in self.breaches]}


def decide(records: Iterable[RequestRecord], budget: LatencyBudget = DEFAULT_BUDGET,
           step_s: float = 15.0) -> list[RollbackDecision]:
    """A decision per tier configuration, in rollout order."""
    if not step_s > 0:
        raise ValueError(f"step_s must be > 0, got {step_s!r}")
    groups: dict[str, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: r.arrival_s):
        groups.setdefault(record.tier_config_id or UNKNOWN_CONFIG, []).append(record)
    decisions, previous = [], None
    for config_id, group in groups.items():
        breaches = tuple(b for name in METRICS
                         if (b := _breach(group, name, budget, step_s)) is not None)
        decisions.append(RollbackDecision(config_id, len(group), breaches,
                                          previous if breaches else None))
        previous = config_id
    return decisions


def sustained_p99(records: Iterable[RequestRecord], metric: str, window_s: float,
                  sustained_s: float, step_s: float = 1.0) -> float | None:
    """The highest p99 the records held at every instant for ``sustained_s`` (the rule's own
    statistic): a budget at or above it does not fire on them. ``None`` without values."""
    field = METRICS[metric][0]
    points = sorted((r.arrival_s, getattr(r, field)) for r in records
                    if getattr(r, field) is not None)
    if not points:
        return None
    times = np.asarray([p[0] for p in points])
    values = np.asarray([p[1] for p in points])
    grid = np.arange(times[0], times[-1] + window_s + step_s, step_s)
    series = [-np.inf if (p99 := window_p99(times, values, t, window_s)) is None else p99
              for t in grid]
    span = max(int(np.ceil(sustained_s / step_s)), 0) + 1  # instants from t to t + sustained_s
    held = [min(series[i:i + span]) for i in range(len(series) - span + 1)]
    best = max(held) if held else -np.inf
    return float(best) if np.isfinite(best) else None


def budget_from_baseline(records: Sequence[RequestRecord], margin: float, window_s: int,
                         sustained_s: int, step_s: float = 1.0) -> LatencyBudget:
    """A budget ``margin`` times the highest p99 the baseline ``records`` sustained (per
    metric): the rule then keeps a configuration unless it makes the tail that much worse
    than the baseline ever held. ``ValueError`` when the records have no latencies."""
    if not margin >= 1:
        raise ValueError(f"margin must be >= 1, got {margin!r}")
    levels = {m: sustained_p99(records, m, window_s, sustained_s, step_s) for m in METRICS}
    missing = [m for m, v in levels.items() if not v]
    if missing:
        raise ValueError(f"the baseline has no {', '.join(missing)} measurements to set a budget from")
    return LatencyBudget(ttft_p99_s=margin * levels["ttft"], itl_p99_s=margin * levels["itl"],
                         sustained_s=sustained_s, window_s=window_s)


def _breach(group: list[RequestRecord], metric: str, budget: LatencyBudget,
            step_s: float) -> Breach | None:
    field, budget_field = METRICS[metric]
    limit = getattr(budget, budget_field)
    points = [(r.arrival_s, getattr(r, field)) for r in group if getattr(r, field) is not None]
    if not points:
        return None
    times = np.asarray([p[0] for p in points])
    values = np.asarray([p[1] for p in points])
    over = Sustained(budget.sustained_s)
    for t in np.arange(times[0], times[-1] + budget.window_s + step_s, step_s):
        p99 = window_p99(times, values, t, budget.window_s)
        if over.update(t, p99 is not None and p99 > limit, p99):
            return Breach(metric, limit, float(t), over.worst)
    return None
