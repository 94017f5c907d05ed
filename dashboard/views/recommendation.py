"""Recommendation: the current recommendation with its evidence, the generated engine
configs ready to copy, and the rollback rule's status."""

from __future__ import annotations

import json

import streamlit as st

from dashboard.artifacts import Recommendation, load_recommendation
from dashboard.views.base import PageContext


def render(ctx: PageContext) -> None:
    folder = ctx.config.recommendation
    try:
        reco = load_recommendation(folder)
    except ValueError as error:
        st.error(str(error))
        return
    if reco is None:
        st.info(
            f"No recommendation under `{folder}` yet.\n\n"
            "`kvtier recommend --store STORE --engine all --out "
            f"{folder}` (issue #5) trains the admission model, sweeps thresholds and writes "
            "`recommendation.json` with the engine configs; this page then shows the "
            "recommendation, its evidence, the configs ready to copy and the rollback-rule status.")
        return
    _fields(reco)
    _rollback(ctx, reco.fields.get("rollback"))
    for name, language, text in reco.configs:
        st.subheader(name)
        st.code(text, language=language)


def _fields(reco: Recommendation) -> None:
    fields = reco.fields
    if "knob" in fields:
        st.metric(str(fields["knob"]), str(fields.get("value", "")))
    for key in ("expected_effect", "evidence"):
        if key in fields:
            st.subheader(key.replace("_", " "))
            if isinstance(fields[key], (dict, list)):
                st.json(fields[key])
            else:
                st.write(fields[key])
    rest = {k: v for k, v in fields.items() 
            if k not in ("knob", "value", "expected_effect", "evidence", "rollback")}
    if rest:
        st.code(json.dumps(rest, indent=2), language="json")


def _rollback(ctx: PageContext, rule) -> None:
    st.subheader("Rollback rule")
    if not isinstance(rule, dict):
        st.info("The recommendation names no rollback budgets (`rollback.ttft_p99_budget_s`, "
                "`rollback.itl_p99_budget_s`), so there is no rule to check.")
        return
    latency = ctx.query("request_latency")
    p99 = latency[latency["quantile"] == "p99"]
    if p99.empty:
        st.info("No TTFT/ITL measurements to check the rule against.")
        return
    newest = p99["tier_config"].iloc[-1]
    for metric, key in (("ttft", "ttft_p99_budget_s"), ("itl", "itl_p99_budget_s")):
        row = p99[(p99["tier_config"] == newest) & (p99["metric"] == metric)]
        if key in rule and not row.empty:
            value_ms, budget_ms = float(row["latency_ms"].iloc[0]), float(rule[key]) * 1000
            status = "over budget: roll back the newest tier" if value_ms > budget_ms else "within budget"
            st.write(f"`{newest}` {metric.upper()} p99 {value_ms:.1f} ms against {budget_ms:.1f} ms: **{status}**")
