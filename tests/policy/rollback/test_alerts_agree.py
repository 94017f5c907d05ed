"""The rollback rule and the Prometheus alerts agree on the same request records.

The same records go (a) to ``kvtier.policy.rollback.decide.decide`` and (b) through kvtier's own
Prometheus exporter (``MetricsState`` + ``KvtierCollector``, scraped once a minute) into the
input series of a ``promtool test rules`` unit test of ``rules_yaml``; promtool must see an
alert fire, at some point, for exactly the configurations ``decide`` rolls back.
"""

from __future__ import annotations

import subprocess

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin, RequestRecord
from kvtier.collector.exports.aggregate import MetricsState
from kvtier.policy.rollback.alerts import alert_rules, rules_yaml
from kvtier.policy.rollback.rule import LatencyBudget
from kvtier.collector.exports.prometheus import KvtierCollector
from kvtier.policy.rollback.decide import METRICS, decide
from tests.conftest import require_binary

BUDGET = LatencyBudget(ttft_p99_s=2.0, itl_p99_s=0.1, sustained_s=300, window_s=120)
SCRAPE_S = 60
PHASE_S = 1200
END_S = 3 * PHASE_S + 600  # room after the last phase for both rules to settle
HISTOGRAMS = ("kvtier_request_ttft_seconds", "kvtier_request_itl_seconds")


def phase(config: str, start_s: float, slow: tuple[float, float] | None) -> list[RequestRecord]:
    """A request every 5 s for ``PHASE_S``: TTFT 0.2 s, or 3-4.5 s inside ``slow``."""
    out = []
    for i in range(PHASE_S // 5):
        t = start_s + i * 5 + 2.5
        over = slow is not None and slow[0] <= t < slow[1]
        out.append(RequestRecord(f"{config}-{i}", t, 256, 16, ttft_s=3.0 + (i % 4) / 2 if over else 0.2,
                                 itl_s=0.01, tier_config_id=config))
    return out


RECORDS = (phase("gpu-only", 0, None)                                   # never over budget
           + phase("gpu+cpu", PHASE_S, (1800, 1860))                    # a one-minute spike
           + phase("gpu+cpu+file", 2 * PHASE_S, (2700, 3 * PHASE_S)))  # 15 minutes over


def scraped_series(records: list[RequestRecord]) -> dict[str, list[str]]:
    """``{series: [value per scrape]}`` as kvtier's exporter would serve the histograms at
    each scrape (``"_"``: the series did not exist yet)."""
    state = MetricsState(clock=lambda: 0.0)
    origin = Origin("vllm", "n1", "n1/test")
    scrapes = END_S // SCRAPE_S + 1
    series: dict[str, list[str]] = {}
    for k in range(scrapes):
        now = k * SCRAPE_S
        batch = [r for r in records if now - SCRAPE_S < r.arrival_s <= now]
        if batch:
            state.observe(EventBatch.from_rows(origin, k, requests=batch))
        for family in KvtierCollector(state).collect():
            if family.name not in HISTOGRAMS:
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
                    series.setdefault(f"{sample.name}{{{labels}}}", ["_"] * k).append(f"{sample.value:g}")
    return series


def promtool_fired(records: list[RequestRecord], expected: list[tuple[str, str]], tmp_path) -> None:
    """Run promtool; it passes only if the alerts that ever fired are ``expected``."""
    (tmp_path / "rules.yml").write_text(rules_yaml(BUDGET))
    inputs = "\n".join(f"      - series: '{name}'\n        values: '{' '.join(values)}'"
                       for name, values in scraped_series(records).items())
    samples = "\n".join(f"          - labels: '{{alertname=\"{a}\",tier_config=\"{c}\"}}'\n"
                        f"            value: 1" for a, c in expected) or "          []"
    (tmp_path / "test.yml").write_text(f"""rule_files: [rules.yml]
evaluation_interval: {SCRAPE_S}s
tests:
  - interval: {SCRAPE_S}s
    input_series:
{inputs}
    promql_expr_test:
      - expr: count by (alertname, tier_config) (max_over_time(ALERTS{{alertstate="firing"}}[{END_S}s]))
        eval_time: {END_S}s
        exp_samples:
{samples}
""")
    result = subprocess.run([require_binary("promtool"), "test", "rules", "test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def alert_names() -> dict[str, str]:
    """rollback metric ("ttft", "itl") -> the alert that watches the same histogram."""
    return {metric: rule["alert"] for rule in alert_rules(BUDGET)
            for metric in METRICS if f"kvtier_request_{metric}_seconds" in rule["expr"]}


def test_alerts_fire_for_exactly_the_configurations_the_rollback_rule_rolls_back(tmp_path):
    decisions = decide(RECORDS, BUDGET, step_s=SCRAPE_S)
    # the scenario holds: the sustained breach is rolled back, the spike and the baseline kept
    assert [(d.tier_config_id, d.rollback_to) for d in decisions] == [
        ("gpu-only", None), ("gpu+cpu", None), ("gpu+cpu+file", "gpu+cpu")]
    names = alert_names()
    assert set(names) == set(METRICS)
    fired = [(names[b.metric], d.tier_config_id) for d in decisions for b in d.breaches]
    assert fired == [("KvtierTTFTP99OverBudget", "gpu+cpu+file")]
    promtool_fired(RECORDS, fired, tmp_path)


def test_a_spike_shorter_than_the_sustained_interval_triggers_neither(tmp_path):
    # two minutes over: with the two-minute window, about four minutes of breach, for: is five
    spike = phase("gpu+cpu", 0, (600, 720))
    assert not any(d.fired for d in decide(spike, BUDGET, step_s=SCRAPE_S))
    promtool_fired(spike, [], tmp_path)
