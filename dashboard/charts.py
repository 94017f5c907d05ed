"""Vega-Lite specs for the pages. Plain dicts (no Altair), so tests can read them back.

Each builder takes the column names its query returns and nothing else; data is passed to
``st.vega_lite_chart`` separately.
"""

from __future__ import annotations

from dashboard.queries import OUTCOME_ORDER

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
            "x": {"field": "time", "type": "temporal", "title": "time (UTC)"},
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


def whatif_curves(tier: str) -> dict:
    """Hit ratio against a tier's capacity, one line per policy (Belady dashed), the chosen
    point as a diamond."""
    return {
        "layer": [
            {"mark": {"type": "line", "point": True, "tooltip": True},
             "encoding": {
                 "x": {"field": "capacity_tokens", "type": "quantitative",
                       "title": f"{tier.upper()} tier capacity (tokens)"},
                 "y": {"field": "token_hit_ratio", "type": "quantitative", "title": "token hit ratio",
                       "axis": {"format": "%"}},
                 "color": {"field": "policy", "type": "nominal"},
                 "strokeDash": {"field": "bound", "type": "nominal", "title": "line",
                                "scale": {"domain": ["policy", "bound"], "range": [[1, 0], [6, 4]]}}}},
            {"transform": [{"filter": "datum.chosen"}],
             "mark": {"type": "point", "size": 250, "shape": "diamond", "filled": True, "color": "black"},
             "encoding": {"x": {"field": "capacity_tokens", "type": "quantitative"},
                          "y": {"field": "token_hit_ratio", "type": "quantitative"}}},
        ],
    }


def size_latency() -> dict:
    """Median promotion time against block size (log-log), one line per source tier."""
    return {
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "block_bytes", "type": "quantitative", "title": "block size (bytes, log)",
                  "scale": {"type": "log"}},
            "y": {"field": "p50_ms", "type": "quantitative", "title": "median promotion time (ms)",
                  "scale": {"type": "log"}},
            "color": {"field": "source_tier", "type": "nominal", "title": "source tier"},
        },
    }


def p99_over_time(configs: list[str]) -> dict:
    """p99 latency per time bucket, one line per tier configuration (rollout order)."""
    return {
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "time", "type": "temporal", "title": "time (UTC)"},
            "y": {"field": "p99_ms", "type": "quantitative", "title": "p99 (ms)"},
            "color": {"field": "tier_config", "type": "nominal", "title": "tier configuration",
                      "sort": configs},
        },
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
