"""Recommendation: the verdict with its evidence (expected change with intervals, the knobs),
the generated engine configs ready to copy, and the rollback rule's status."""

from __future__ import annotations

import json

import streamlit as st

from dashboard import charts
from dashboard.artifacts import Recommendation, load_recommendation
from dashboard.views.base import PageContext, chart


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
            f"`kvtier recommend --store STORE --engine all --out {folder}` (or `--trace TRACE`) "
            "trains the admission model, sweeps thresholds and writes `recommendation.json` with "
            "the engine configs; this page then shows the verdict, the expected change with its "
            "intervals, the configs ready to copy and the rollback-rule status.")
        return
    _verdict(reco)
    _expected(reco)
    if not reco.knobs.empty:
        st.subheader("Settings")
        st.dataframe(reco.knobs, hide_index=True)
    _host_and_file_tier(reco.evidence)
    _rollback(ctx, reco.rollback)
    _configs(reco)


def _verdict(reco: Recommendation) -> None:
    verdict = reco.evidence.get("verdict")
    if verdict is None:  # not kvtier recommend's format: show what there is
        st.code(json.dumps(reco.doc, indent=2), language="json")
        return
    reasons = "\n".join(f"- {r['reason']}: {r['evidence']}" if isinstance(r, dict) else f"- {r}"
                        for r in reco.evidence.get("reasons", []))
    text = f"**Verdict: {str(verdict).replace('_', ' ')}**\n\n{reasons}"
    if verdict == "offload":
        st.success(text)
    else:
        st.warning(text)
    for note in reco.doc.get("notes", []):
        st.caption(str(note))


def _expected(reco: Recommendation) -> None:
    expected = reco.expected
    if expected.empty:
        return
    st.subheader("Expected change against the baseline (interval: bootstrap 5th-95th percentile)")
    chart(expected, charts.expected_changes())


def _host_and_file_tier(evidence: dict) -> None:
    """Whether the CPU size was checked against host memory (and what the cap cost), and the
    vLLM file-tier decision with its measured or assumed costs."""
    host, file_tier = evidence.get("host_memory"), evidence.get("vllm_file_tier")
    if not isinstance(host, dict) and not isinstance(file_tier, dict):
        return
    st.subheader("Host memory and file tier")
    if isinstance(host, dict) and not host.get("checked"):
        st.warning("The CPU tier size was **not checked against host memory**: run "
                   "`kvtier probe headroom --json` and pass it to `kvtier recommend "
                   "--headroom-json`.")
    elif isinstance(host, dict):
        gib = 2 ** 30
        text = (f"Host headroom {host.get('headroom_bytes', 0) / gib:.1f} GiB less a "
                f"{host.get('safety_margin_bytes', 0) / gib:.1f} GiB margin: the CPU tier may "
                f"take {host.get('cap_bytes', 0) / gib:.1f} GiB ({host.get('source', '')}).")
        if host.get("capped"):
            text += (f" The {host.get('requested_cpu_bytes', 0) / gib:.1f} GiB asked for was "
                     f"capped to {host.get('recommended_cpu_bytes', 0) / gib:.1f} GiB")
            lru_at = (host.get("token_hit_ratio_lru_at_requested"),
                      host.get("token_hit_ratio_lru_at_cap"))
            if None not in lru_at:
                text += (f"; LRU token hit ratio {lru_at[0]:.1%} at the asked size, "
                         f"{lru_at[1]:.1%} at the cap")
            text += "."
        st.info(text)
    if isinstance(file_tier, dict) and file_tier.get("reason"):
        (st.success if file_tier.get("add") else st.warning)(
            f"vLLM file tier: {file_tier['reason']}")


def _configs(reco: Recommendation) -> None:
    if reco.configs:
        st.subheader("Engine configs, ready to copy")
        st.caption("Apply one with `kvtier push` (it checks guardrails, shows the diff and keeps a backup).")
    for name, language, text in reco.configs:
        st.markdown(f"**{name}**")
        st.code(text, language=language)
    if reco.plots or reco.report:
        with st.expander("Full report"):
            if reco.report:
                st.markdown(reco.report)
            for plot in reco.plots:
                st.image(str(plot), caption=plot.name)


def _rollback(ctx: PageContext, rule: dict | None) -> None:
    st.subheader("Rollback rule")
    if rule is None:
        st.info("The recommendation names no rollback budgets (`rollback.ttft_p99_budget_s`, "
                "`rollback.itl_p99_budget_s`), so there is no rule to check yet.")
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
