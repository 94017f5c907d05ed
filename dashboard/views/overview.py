"""Overview: how prompt tokens were served over time (GPU hit, CPU promotion, cold promotion,
recompute), split by tier configuration; the lookup events (blocks) as a second view."""

from __future__ import annotations

import time

import streamlit as st

from kvtier.dashboard import charts, crosschecks, queries
from kvtier.dashboard.views.base import PageContext, chart, rollout_in_progress


def render(ctx: PageContext) -> None:
    span = (ctx.facets.start_s, ctx.facets.end_s)
    frame, unit = ctx.query("hit_quality", span)
    notice = rollout_in_progress(ctx.facets)
    if notice:
        st.warning(notice)
    # the minute keeps the query cached between reruns; intervals settle within seconds
    disagreement = crosschecks.disagreement(ctx.query("crosschecks", time.time() // 60 * 60))
    if disagreement:
        st.warning(disagreement)
    if frame.empty:
        st.info("No lookups match the filters: widen the time range or clear the engine, instance "
                "or configuration filters.")
        return
    if unit == "tokens":
        st.caption("Shares of prompt tokens, from the request records: tokens served by each "
                   "tier and recomputed (what the engine counts per request).")
    else:
        st.caption("The request records carry no tier split: outcomes are lookup events "
                   "(blocks), whatever their tokens.")
    totals = queries.outcome_totals(frame)
    configs = [c for c in ctx.facets.tier_configs if c in set(totals["tier_config"])]
    _metrics(totals, unit, configs)
    st.subheader("How lookups were served, by tier configuration")
    chart(totals, charts.outcome_totals(unit, configs))
    st.subheader("Over time")
    chart(frame, charts.hit_quality_over_time(unit, configs), stretch=False)
    st.subheader("Totals")
    order = totals["tier_config"].map({c: i for i, c in enumerate(configs)})
    table = totals.assign(order=order).sort_values(["order", "outcome_rank"])
    st.dataframe(table.drop(columns=["order", "outcome_rank"]), hide_index=True)
    if unit == "tokens":
        _events(ctx, span, configs)


def _events(ctx: PageContext, span, configs: list[str]) -> None:
    """The lookup events beside the token shares: how many block lookups each outcome had."""
    events, unit = ctx.query("hit_quality", span, "blocks")
    if unit != "blocks" or events.empty:
        return
    st.subheader("Lookup events, by tier configuration")
    st.caption("Counted in block events: a share of lookups, not of prompt tokens (an event "
               "may stand for any number of tokens; a prompt's last partial block has none).")
    chart(queries.outcome_totals(events), charts.outcome_totals(unit, configs))


def _metrics(totals, unit: str, configs: list[str]) -> None:
    """The headline, one row of shares per tier configuration in rollout order: before and
    after a push are two deployments, and one figure over both would describe neither."""
    headline = queries.headline(totals, configs)
    for config, rows in headline.groupby("tier_config", sort=False):
        st.markdown(f"**`{config}`**")
        for column, row in zip(st.columns(len(rows)), rows.itertuples()):
            column.metric(row.outcome.replace("_", " "), f"{row.share:.1%}",
                          help=f"share of {unit} under the tier configuration {config}")
