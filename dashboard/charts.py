"""Vega-Lite specs for the pages. Plain dicts (no Altair), so tests can read them back.

Each builder takes the column names its query returns and nothing else; data is passed to
``st.vega_lite_chart`` separately.
"""

from __future__ import annotations

from kvtier.dashboard.queries import OUTCOME_ORDER

OUTCOME_COLOURS = ("#2ca02c", "#1f77b4", "#9467bd", "#d62728")
QUANTILES = ("p50", "p95", "p99")
_OUTCOME_SCALE = {"domain": list(OUTCOME_ORDER), "range": list(OUTCOME_COLOURS)}


def _outcome_colour() -> dict:
    return {"field": "outcome", "type": "nominal", "title": "outcome", "scale": _OUTCOME_SCALE,
            "sort": list(OUTCOME_ORDER)}


def hit_quality_over_time(unit: str, configs: list[str]) -> dict:
    """Stacked share of lookup outcomes per time bucket, one row per tier configuration
    (rows in ``configs`` order: the rollout order)."""
    return {
        "mark": {"type": "area", "interpolate": "step-after", "tooltip": True},
        "width": 680, "height": 150,
        "encoding": {
            "x": {"field": "time", "type": "temporal", "title": "time (UTC)",
                  "axis": {"format": "%H:%M:%S"}},
            "y": {"field": "share", "type": "quantitative", "stack": "normalize",
                  "title": f"share of {unit}", "axis": {"format": "%"}},
            "color": _outcome_colour(),
            "order": {"field": "outcome_rank", "type": "quantitative"},
            "row": {"field": "tier_config", "type": "nominal", "title": "tier configuration",
                    "sort": configs},
        },
    }


def outcome_totals(unit: str, configs: list[str]) -> dict:
    """One normalised bar per tier configuration (in ``configs`` order): how its lookups
    were served."""
    return {
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "y": {"field": "tier_config", "type": "nominal", "title": "tier configuration", "sort": configs},
            "x": {"field": "amount", "type": "quantitative", "stack": "normalize",
                  "title": f"share of {unit}", "axis": {"format": "%"}},
            "color": _outcome_colour(),
            "order": {"field": "outcome_rank", "type": "quantitative"},
        },
    }


def grouped_quantiles(group_field: str, title: str) -> dict:
    """Bars of ``latency_ms`` per group, one bar per quantile side by side."""
    return {
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "x": {"field": group_field, "type": "nominal", "title": title, "sort": None,
                  "axis": {"labelAngle": 0}},
            "xOffset": {"field": "quantile", "type": "nominal", "sort": list(QUANTILES)},
            "y": {"field": "latency_ms", "type": "quantitative", "title": "milliseconds"},
            "color": {"field": "quantile", "type": "nominal", "sort": list(QUANTILES),
                      "scale": {"scheme": "oranges"}},
        },
    }


def reuse_classes() -> dict:
    return {
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "x": {"field": "reuse_class", "type": "ordinal", "title": "times the block was looked up",
                  "sort": {"field": "rank"}, "axis": {"labelAngle": 0}},
            "y": {"field": "blocks", "type": "quantitative", "title": "blocks"},
        },
    }


def reuse_gaps() -> dict:
    return {
        "mark": {"type": "bar", "tooltip": True},
        "encoding": {
            "x": {"field": "gap_s", "type": "quantitative", "title": "seconds until reuse (log)",
                  "scale": {"type": "log"}},
            "x2": {"field": "gap_end_s"},
            "y": {"field": "uses", "type": "quantitative", "title": "reuses"},
            "y2": {"datum": 0},
        },
    }


def shared_by_position() -> dict:
    return {
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "position", "type": "quantitative", "title": "block position in prompt"},
            "y": {"field": "shared_share", "type": "quantitative", "title": "share of blocks shared",
                  "axis": {"format": "%"}},
        },
    }


POLICY_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                  "#bcbd22")


def whatif_curves(tier: str, policies: list[str] | None = None) -> dict:
    """Hit ratio against a tier's capacity, one line per policy (Belady dashed), the chosen
    point as a diamond. ``policies`` fixes the colours (in that order) so they can be told
    apart on the page; the default is Vega's scheme."""
    colour = {"field": "policy", "type": "nominal"}
    if policies:
        colour["scale"] = {"domain": list(policies),
                           "range": [POLICY_COLOURS[i % len(POLICY_COLOURS)] for i in range(len(policies))]}
    return {
        "layer": [
            {"mark": {"type": "line", "point": True, "tooltip": True},
             "encoding": {
                 "x": {"field": "capacity_tokens", "type": "quantitative",
                       "title": f"{tier.upper()} tier capacity (tokens)"},
                 "y": {"field": "token_hit_ratio", "type": "quantitative", "title": "token hit ratio",
                       "axis": {"format": "%"}},
                 "color": colour,
                 "strokeDash": {"field": "bound", "type": "nominal", "title": "line",
                                "scale": {"domain": ["policy", "bound"], "range": [[1, 0], [6, 4]]}}}},
            {"transform": [{"filter": "datum.chosen"}],
             "mark": {"type": "point", "size": 250, "shape": "diamond", "filled": True, "color": "black"},
             "encoding": {"x": {"field": "capacity_tokens", "type": "quantitative"},
                          "y": {"field": "token_hit_ratio", "type": "quantitative"}}},
        ],
    }


def size_latency() -> dict:
    """Median load wait per job against the bytes the job moved (log-log), one line per source tier."""
    return {
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "job_bytes", "type": "quantitative", "title": "bytes per load job (log)",
                  "scale": {"type": "log"}},
            "y": {"field": "p50_ms", "type": "quantitative", "title": "median load wait per job (ms)",
                  "scale": {"type": "log"}},
            "color": {"field": "source_tier", "type": "nominal", "title": "source tier"},
        },
    }


def p99_over_time(configs: list[str], moves: list[dict] | None = None) -> dict:
    """p99 latency per time bucket, one line per tier configuration (rollout order); with
    ``moves`` (the guardrail's, as records with an ISO ``time``), a vertical rule at each,
    dashed where the rule only observed, its details in the tooltip."""
    x = {"field": "time", "type": "temporal", "title": "time (UTC)", "axis": {"format": "%H:%M:%S"}}
    lines = {
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": x,
            "y": {"field": "p99_ms", "type": "quantitative", "title": "p99 (ms)"},
            "color": {"field": "tier_config", "type": "nominal", "title": "tier configuration",
                      "sort": configs},
        },
    }
    if not moves:
        return lines
    rules = {
        "data": {"values": moves},
        "mark": {"type": "rule", "strokeWidth": 2, "opacity": 0.7},
        "encoding": {
            "x": x,
            "color": {"field": "action", "type": "nominal", "title": "guardrail",
                      "scale": {"domain": ["pause", "resume"], "range": ["#d62728", "#2ca02c"]}},
            "strokeDash": {"field": "mode", "type": "nominal", "title": "mode"},
            "tooltip": [{"field": f, "type": "nominal"} for f in
                        ("time", "instance", "actor", "action", "paused", "reason", "ttft_p99_ms",
                         "budget_ms")],
        },
    }
    return {"layer": [lines, rules], "resolve": {"scale": {"color": "independent"}}}


def ttft_change() -> dict:
    """The change of each TTFT percentile against the baseline in milliseconds (a point), its
    5th-95th percentile interval (a rule), and zero (no change) as a reference line."""
    y = {"field": "quantile", "type": "nominal", "title": None, "sort": list(QUANTILES)}
    x = {"field": "change_ms", "type": "quantitative", "title": "change in time to first token (ms)"}
    return {
        "height": {"step": 40},
        "layer": [
            {"mark": {"type": "rule", "color": "#888888", "strokeDash": [4, 4]},
             "encoding": {"x": {"datum": 0}}},
            {"mark": {"type": "rule", "strokeWidth": 3, "color": "#2ca02c", "opacity": 0.6},
             "encoding": {"y": y, "x": {"field": "low_ms", "type": "quantitative"},
                          "x2": {"field": "high_ms"}}},
            {"mark": {"type": "point", "filled": True, "size": 160, "color": "#2ca02c",
                      "tooltip": True},
             "encoding": {"y": y, "x": x}},
        ],
    }


def tier_curve(tier: str, unit: str) -> dict:
    """Token hit ratio against a tier's size (``capacity`` in ``unit``), the chosen size as
    a vertical rule."""
    x = {"field": "capacity", "type": "quantitative", "title": f"{tier} tier size ({unit})"}
    return {
        "layer": [
            {"mark": {"type": "line", "point": True, "tooltip": True},
             "encoding": {"x": x, "y": {"field": "token_hit_ratio", "type": "quantitative",
                                        "title": "token hit ratio", "axis": {"format": "%"}}}},
            {"transform": [{"filter": "datum.chosen"}],
             "mark": {"type": "rule", "strokeWidth": 2, "strokeDash": [6, 4], "color": "black"},
             "encoding": {"x": x}},
        ],
    }


def expected_changes() -> dict:
    """Expected change of each metric against the baseline (share of baseline), with its
    interval as a rule."""
    y = {"field": "metric", "type": "nominal", "title": None, "sort": None, "axis": {"labelLimit": 260}}
    return {
        "height": {"step": 32},
        "layer": [
            {"mark": {"type": "bar", "tooltip": True},
             "encoding": {"y": y, "x": {"field": "change_share", "type": "quantitative",
                                        "title": "expected change vs. baseline", "axis": {"format": "+%"}},
                          "color": {"condition": {"test": "datum.change_share < 0", "value": "#1f77b4"},
                                    "value": "#ff7f0e"}}},
            {"mark": {"type": "rule", "strokeWidth": 2, "color": "black"},
             "encoding": {"y": y, "x": {"field": "low_share", "type": "quantitative"},
                          "x2": {"field": "high_share"}}},
        ],
    }


def live_curves(tier: str) -> dict:
    """Each instance's live token hit ratio against the tier's size (GiB), one line each."""
    return {
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "size_gib", "type": "quantitative", "title": f"{tier} tier size (GiB)"},
            "y": {"field": "hit_ratio", "type": "quantitative", "title": "token hit ratio",
                  "axis": {"format": "%"}},
            "color": {"field": "instance", "type": "nominal", "title": "instance"},
        },
    }
