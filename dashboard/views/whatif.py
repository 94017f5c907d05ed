"""What-if: hit ratio against CPU capacity for each policy, the Belady bound, the chosen point."""

from __future__ import annotations

import streamlit as st

from dashboard import charts
from dashboard.artifacts import load_whatif
from dashboard.views.base import PageContext, chart


def render(ctx: PageContext) -> None:
    folder = ctx.config.whatif
    try:
        results = load_whatif(folder)
    except ValueError as error:
        st.error(str(error))
        return
    if results is None:
        st.info(
            f"No what-if results under `{folder}` yet.\n\n"
            "What-if curves come from replaying a trace against tier sizes and policies:\n"
            "`kvtier simulate --trace TRACE --cpu-tokens N --policy lru --json` for each point "
            f"(the simulator, issue #3), with the results written to `{folder}/`. "
            "This page then draws hit ratio against CPU capacity for each policy, with the "
            "Belady bound and the chosen point.")
        return
    chart(results.points, charts.whatif_curves())
    st.caption("Sources: " + ", ".join(f"`{p.name}`" for p in results.files))
    st.dataframe(results.points, hide_index=True)
