"""The rollback rule, defined once: when the p99 time to first token, or the p99 inter-token
latency, of the tier configuration in service stays above its budget for a sustained interval,
disable the newest tier and return to the configuration before it.

:func:`kvtier.policy.rollback.decide.decide` applies it to request records (the rollout and the
demo); :func:`kvtier.policy.rollback.alerts.rules_yaml` renders it as Prometheus alerting rules over
kvtier's metrics, for an operator's Alertmanager.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LatencyBudget:
    """Budgets the rollback rule enforces. ``sustained_s`` is how long a breach must last;
    ``window_s`` is the rate window the quantiles are computed over."""

    ttft_p99_s: float = 2.0
    itl_p99_s: float = 0.1
    sustained_s: int = 300
    window_s: int = 120

    def __post_init__(self) -> None:
        for name in ("ttft_p99_s", "itl_p99_s", "sustained_s", "window_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"LatencyBudget.{name} must be > 0, got {value!r}")
