"""Reuse: which blocks are shared, how soon they come back, and which never do."""

from __future__ import annotations

import streamlit as st

from kvtier.dashboard import charts
from kvtier.dashboard.views.base import PageContext, chart


def render(ctx: PageContext) -> None:
    figures = ctx.query("reuse")
    classes = figures["classes"]
    if classes.empty:
        st.info("No block hashes to analyse: reuse needs block events or request records with "
                "`block_hashes` (the Mooncake, WEKA and Bailian traces have them).")
        return
    total = int(classes["blocks"].sum())
    never = int(classes.loc[classes["rank"] == 0, "blocks"].sum())
    stores = figures["stores"]
    left, middle, right = st.columns(3)
    left.metric("distinct blocks", f"{total:,}")
    middle.metric("never reused", f"{never / total:.1%}" if total else "-", help="looked up once only")
    if stores["stored_blocks"]:
        right.metric("stored, never promoted", f"{stores['never_promoted'] / stores['stored_blocks']:.1%}",
                     help=f"of {stores['stored_blocks']:,} blocks written to a lower tier")
    st.subheader("Shared blocks: how often each block was looked up")
    chart(classes, charts.reuse_classes())
    st.subheader("Shared prefixes: share of blocks reused, by position in the prompt")
    chart(figures["by_position"], charts.shared_by_position())
    gaps = figures["gaps"]
    st.subheader("Reuse time: seconds between uses of the same block")
    if gaps.empty:
        st.info("No block was used twice in the selection, so there is no reuse time to show.")
    else:
        chart(gaps, charts.reuse_gaps())
    _size_against_budget(ctx)
    st.dataframe(classes.drop(columns="rank"), hide_index=True)


def _size_against_budget(ctx: PageContext) -> None:
    st.subheader("Load size against the transfer budget")
    sizes = ctx.query("size_latency")
    if sizes.empty:
        st.info("No load jobs with bytes and a wait: the transfer budget needs block events "
                "from engine probes.")
        return
    chart(sizes, charts.size_latency())
    st.dataframe(sizes, hide_index=True)
