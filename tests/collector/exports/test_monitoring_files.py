"""Alert rules pass promtool and fire exactly when the rollback rule says; the Grafana JSON is sound."""

from __future__ import annotations

import json
import subprocess

import pytest

from kvtier.policy.rollback.alerts import alert_rules, rules_yaml
from kvtier.policy.rollback.rule import LatencyBudget
from kvtier.collector.exports.grafana import dashboard, panel_queries
from tests.conftest import require_binary



def test_promtool_accepts_the_rules(tmp_path):
    path = tmp_path / "kvtier-alerts.yml"
    path.write_text(rules_yaml(LatencyBudget(ttft_p99_s=2.0, itl_p99_s=0.1)))
    result = subprocess.run([require_binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rules found" in result.stdout


def _series(config: str, buckets: dict[str, str]) -> str:
    return "\n".join(
        f"      - series: 'kvtier_request_ttft_seconds_bucket{{engine=\"vllm\",engine_instance=\"n1\","
        f"tier_config=\"{config}\",le=\"{le}\"}}'\n        values: '{values}'" for le, values in buckets.items())


def test_ttft_alert_fires_only_for_the_configuration_over_budget(tmp_path):
    budget = LatencyBudget(ttft_p99_s=2.0, itl_p99_s=0.1, sustained_s=300, window_s=120)
    (tmp_path / "rules.yml").write_text(rules_yaml(budget))
    (ttft_rule,) = [r for r in alert_rules(budget) if r["alert"] == "KvtierTTFTP99OverBudget"]
    description = ttft_rule["annotations"]["description"]
    # "gpu+cpu+cold": every request takes 2-5 s to its first token (p99 ~ 4.97 s > 2 s).
    # "gpu+cpu": every request is under 0.5 s.
    slow = _series("gpu+cpu+cold", {"0.5": "0+0x20", "2.0": "0+0x20", "5.0": "0+10x20", "+Inf": "0+10x20"})
    fast = _series("gpu+cpu", {"0.5": "0+10x20", "2.0": "0+10x20", "5.0": "0+10x20", "+Inf": "0+10x20"})
    (tmp_path / "test.yml").write_text(f"""rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{slow}
{fast}
    alert_rule_test:
      - eval_time: 4m
        alertname: KvtierTTFTP99OverBudget
        exp_alerts: []
      - eval_time: 10m
        alertname: KvtierTTFTP99OverBudget
        exp_alerts:
          - exp_labels: {{severity: page, kvtier_action: disable_newest_tier, engine: vllm, engine_instance: n1, tier_config: "gpu+cpu+cold"}}
            exp_annotations:
              summary: "p99 time to first token over its 2 s budget on n1 (gpu+cpu+cold)"
              description: {json.dumps(description)}
      - eval_time: 10m
        alertname: KvtierITLP99OverBudget
        exp_alerts: []
""")
    result = subprocess.run([require_binary("promtool"), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_budget_is_validated():
    with pytest.raises(ValueError, match="ttft_p99_s"):
        LatencyBudget(ttft_p99_s=0)


def test_dashboard_json_has_a_panel_per_query_group_and_the_filters():
    model = json.loads(json.dumps(dashboard(LatencyBudget(ttft_p99_s=1.5).ttft_p99_s, LatencyBudget().itl_p99_s)))
    titles = [p["title"] for p in model["panels"]]
    assert titles[:-1] == list(panel_queries()) and titles[-1] == "Current recommendation"
    assert {v["name"] for v in model["templating"]["list"]} == {"datasource", "engine", "engine_instance", "tier_config"}
    ttft = next(p for p in model["panels"] if p["title"].startswith("Time to first token"))
    assert ttft["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 1.5
    assert all(t["expr"] for p in model["panels"] for t in p["targets"])
