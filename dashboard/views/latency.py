"""Latency by tier: the wait a load put on its request (per load job, p50/p95/p99 by source
tier, and recompute) beside the engine's own copy time per job where it reports one, and TTFT
and inter-token latency per tier configuration (rollout phase)."""

from __future__ import annotations

import streamlit as st

from kvtier.dashboard import charts
from kvtier.dashboard.views.base import (
    MIN_PHASE_REQUESTS,
    PageContext,
    chart,
    rollout_in_progress,
)


def render(ctx: PageContext) -> None:
    notice = rollout_in_progress(ctx.facets)
    if notice:
        st.warning(notice)
    _loads(ctx)
    _requests(ctx)


def _loads(ctx: PageContext) -> None:
    st.subheader("Load wait per job by source tier (request path)")
    frame = ctx.query("load_wait")
    if frame.empty:
        st.info("No promotion or recompute events with a latency: block events come from engine "
                "probes (`kvtier collect`); simulated replays without a cost model carry none.")
        return
    st.caption("From the load's start to its completion as the scheduler saw it (vLLM: "
               "prepare_load to complete_load): queueing and the transfer, once per load job "
               "(its blocks share the wait), not per block. Recompute: the prefill's share.")
    chart(frame, charts.grouped_quantiles("source_tier", "source tier"))
    st.dataframe(frame.pivot_table(index=["source_tier", "jobs", "blocks", "mean_ms"], columns="quantile",
                                   values="latency_ms").reset_index(), hide_index=True)
    _copy_time(ctx)


def _copy_time(ctx: PageContext) -> None:
    """The engine's worker-side copy beside the wait: the difference is queueing."""
    frame = ctx.query("copy_time")
    if frame.empty:
        return
    st.subheader("Copy time per load job (engine-measured)")
    st.caption("vLLM's worker-side transfer time (kv_offload_load_time) over its load jobs, "
               "from its scraped metrics: a mean per job, the copy alone, without the queueing "
               "the wait above includes.")
    st.dataframe(frame, hide_index=True)


def _requests(ctx: PageContext) -> None:
    frame = ctx.query("request_latency")
    if frame.empty:
        st.subheader("TTFT and inter-token latency per tier configuration")
        st.info("No request records with TTFT or inter-token latency: they come from engine probes; "
                "trace replays (`kvtier demo`) carry sizes and tier outcomes only.")
        return
    for metric, title in (("ttft", "Time to first token"), ("itl", "Inter-token latency")):
        part = frame[frame["metric"] == metric]
        st.subheader(f"{title} per tier configuration")
        if part.empty:
            st.info(f"No request carries {title.lower()}.")
            continue
        chart(part, charts.grouped_quantiles("tier_config", "tier configuration"))
        few = sorted(set(part.loc[part["requests"] < MIN_PHASE_REQUESTS, "tier_config"]))
        if few:
            st.caption(f"Provisional (fewer than {MIN_PHASE_REQUESTS} requests): {', '.join(few)}")
    _over_time(ctx)
    st.dataframe(frame.pivot_table(index=["tier_config", "metric", "requests"], columns="quantile",
                                   values="latency_ms").reset_index(), hide_index=True)


def _over_time(ctx: PageContext) -> None:
    """The series the rollback rule watches: p99 per time bucket, per configuration, and
    the guardrail's moves on the same timeline."""
    frame = ctx.query("latency_over_time", (ctx.facets.start_s, ctx.facets.end_s))
    moves = ctx.query("tier_moves")
    marks = _records(moves)
    configs = list(ctx.facets.tier_configs)
    for metric, title in (("ttft", "TTFT"), ("itl", "Inter-token latency")):
        part = frame[frame["metric"] == metric]
        if len(part):
            st.subheader(f"{title} p99 over time (what the rollback rule watches)")
            chart(part, charts.p99_over_time(configs, marks))
    if len(moves):
        st.subheader("Guardrail moves")
        st.caption("Each pause and resume of a tier's loads or stores: the rule's decisions "
                   "(observe mode: recorded, not sent), an operator's commands, and what the "
                   "engines applied; the lines above mark them beside the p99 they reacted to. "
                   "Requests after a move carry its tier configuration (`;paused=...`).")
        st.dataframe(moves, hide_index=True)


def _records(moves) -> list[dict]:
    """The moves as chart rows (times as ISO text, which Vega-Lite parses)."""
    out = moves.copy()
    out["time"] = [t.isoformat() for t in out["time"]]
    return out.astype(object).where(out.notna(), None).to_dict("records")
