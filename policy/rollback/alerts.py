"""Prometheus alerting rules rendered from the rollback rule (:class:`LatencyBudget`).

The rollback rule: when the p99 time to first token, or the p99 inter-token latency, of the
tier configuration in service stays above its budget for a sustained interval, disable the
newest tier. These rules raise that alert from kvtier's own metrics, per engine, serving
instance and tier configuration, so an operator's Alertmanager (or ``kvtier rollout``) acts.

The file is YAML written with JSON-quoted scalars, which every YAML parser reads.
"""

from __future__ import annotations

import json

from kvtier.policy.rollback.rule import LatencyBudget

ACTION_LABEL = "kvtier_action"
ROLLBACK_ACTION = "disable_newest_tier"


def _p99(metric: str, window_s: int) -> str:
    return (f"histogram_quantile(0.99, sum by (le, engine, engine_instance, tier_config) "
            f"(rate({metric}_bucket[{window_s}s])))")


def alert_rules(budget: LatencyBudget = LatencyBudget()) -> list[dict]:
    """The rules, as dicts in Prometheus's rule-file layout."""
    rules = []
    for name, metric, limit, what in (
        ("KvtierTTFTP99OverBudget", "kvtier_request_ttft_seconds", budget.ttft_p99_s, "time to first token"),
        ("KvtierITLP99OverBudget", "kvtier_request_itl_seconds", budget.itl_p99_s, "inter-token latency"),
    ):
        rules.append({
            "alert": name,
            "expr": f"{_p99(metric, budget.window_s)} > {limit:g}",
            "for": f"{int(budget.sustained_s)}s",
            "labels": {"severity": "page", ACTION_LABEL: ROLLBACK_ACTION},
            "annotations": {
                "summary": f"p99 {what} over its {limit:g} s budget on {{{{ $labels.engine_instance }}}} "
                           f"({{{{ $labels.tier_config }}}})",
                "description": f"p99 {what} has stayed above {limit:g} s for {int(budget.sustained_s)} s "
                               "under this tier configuration. The rollback rule says: disable the newest "
                               "tier and return to the previous configuration.",
            },
        })
    return rules


def rules_yaml(budget: LatencyBudget = LatencyBudget()) -> str:
    """A Prometheus rule file (``promtool check rules`` accepts it)."""
    lines = ["groups:", "  - name: kvtier-rollback", "    rules:"]
    for rule in alert_rules(budget):
        lines.append(f"      - alert: {_q(rule['alert'])}")
        lines.append(f"        expr: {_q(rule['expr'])}")
        lines.append(f"        for: {_q(rule['for'])}")
        for section in ("labels", "annotations"):
            lines.append(f"        {section}:")
            lines.extend(f"          {key}: {_q(value)}" for key, value in rule[section].items())
    return "\n".join(lines) + "\n"


def _q(value: str) -> str:
    return json.dumps(value)
