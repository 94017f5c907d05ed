"""An importable Grafana dashboard over kvtier's Prometheus metrics.

Import the JSON in Grafana (Dashboards -> New -> Import) and pick the Prometheus data
source; the variables filter by engine, serving instance and tier configuration.
"""

from __future__ import annotations


LOOKUPS = "gpu_hit|cpu_promotion|cold_promotion|recompute_miss"
SERVED = "gpu_hit|cpu_promotion|cold_promotion"
FILTER = 'engine=~"$engine", engine_instance=~"$engine_instance"'
CONFIG_FILTER = FILTER + ', tier_config=~"$tier_config"'


def panel_queries() -> dict[str, list[tuple[str, str]]]:
    """Panel title -> [(PromQL, legend)]: the dashboard's queries, also used by tests."""
    rate = "[$__rate_interval]"
    quantiles = lambda metric, by, filt: [  # noqa: E731
        (f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{filt}}}{rate})))", f"p{int(q * 100)} {{{{{by}}}}}")
        for q in (0.5, 0.95, 0.99)]
    return {
        "Hit quality (tokens/s by outcome)": [
            (f'sum by (kind) (rate(kvtier_block_tokens_total{{kind=~"{LOOKUPS}", {FILTER}}}{rate}))', "{{kind}}")],
        "Prompt tokens served from cache": [
            (f'sum(rate(kvtier_block_tokens_total{{kind=~"{SERVED}", {FILTER}}}{rate})) / '
             f'sum(rate(kvtier_block_tokens_total{{kind=~"{LOOKUPS}", {FILTER}}}{rate}))', "token hit ratio")],
        "Promotion latency by source tier": quantiles("kvtier_promotion_seconds", "tier_from", FILTER),
        "Time to first token by tier configuration": quantiles("kvtier_request_ttft_seconds", "tier_config", CONFIG_FILTER),
        "Inter-token latency by tier configuration": quantiles("kvtier_request_itl_seconds", "tier_config", CONFIG_FILTER),
        "Recomputed prompt tokens/s": [
            (f"sum by (engine_instance) (rate(kvtier_recomputed_tokens_total{{{FILTER}}}{rate}))", "{{engine_instance}}")],
        "Collector health": [
            (f"sum(rate(kvtier_recorder_dropped_events_total{{{FILTER}}}{rate}))", "recorder drops/s"),
            (f"sum by (reason) (rate(kvtier_rejected_rows_total{rate}))", "rejected: {{reason}}"),
            (f"sum by (tap) (rate(kvtier_tap_sequence_gaps_total{rate}))", "gaps: {{tap}}")],
    }


def dashboard(ttft_p99_budget_s: float | None = None, itl_p99_budget_s: float | None = None) -> dict:
    """The dashboard model (JSON-serialisable), with the rollback rule's budgets (seconds) as
    threshold lines on the latency panels when given."""
    panels = []
    for i, (title, queries) in enumerate(panel_queries().items()):
        panel = {
            "id": i + 1, "type": "timeseries", "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "targets": [{"refId": chr(65 + j), "expr": expr, "legendFormat": legend}
                        for j, (expr, legend) in enumerate(queries)],
            "fieldConfig": {"defaults": {"unit": _unit(title)}, "overrides": []},
        }
        threshold = {"Time to first token by tier configuration": ttft_p99_budget_s,
                     "Inter-token latency by tier configuration": itl_p99_budget_s}.get(title)
        if threshold is not None:
            panel["fieldConfig"]["defaults"]["thresholds"] = {
                "mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": threshold}]}
            panel["fieldConfig"]["defaults"]["custom"] = {"thresholdsStyle": {"mode": "line"}}
        panels.append(panel)
    panels.append({
        "id": len(panels) + 1, "type": "table", "title": "Current recommendation",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 6, "w": 24, "x": 0, "y": 8 * ((len(panels) + 1) // 2)},
        "targets": [{"refId": "A", "expr": "kvtier_recommendation_info", "format": "table", "instant": True}],
    })
    return {
        "title": "kvtier: tiered KV cache", "uid": "kvtier-tiers", "schemaVersion": 39, "version": 1,
        "tags": ["kvtier", "kv-cache", "llm-serving"], "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s", "panels": panels,
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            _variable("engine", "label_values(kvtier_block_events_total, engine)"),
            _variable("engine_instance", 'label_values(kvtier_block_events_total{engine=~"$engine"}, engine_instance)'),
            _variable("tier_config", "label_values(kvtier_requests_total, tier_config)"),
        ]},
    }


def _variable(name: str, query: str) -> dict:
    return {"name": name, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": query, "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
            "current": {"text": "All", "value": "$__all"}}


def _unit(title: str) -> str:
    if "latency" in title.lower() or "first token" in title.lower():
        return "s"
    return "percentunit" if "served from cache" in title else "short"
