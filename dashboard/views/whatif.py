"""What-if: hit ratio against tier capacity for each policy, the Belady bound dashed, the
recommended size marked (the demo writes these curves; so can ``kvtier simulate``)."""

from __future__ import annotations

import streamlit as st

from kvtier.dashboard import charts
from kvtier.dashboard.artifacts import load_whatif
from kvtier.dashboard.views.base import PageContext, chart


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
            "What-if curves come from replaying a trace against tier sizes and policies; save "
            f"`kvtier simulate` output as JSON files in `{folder}/`, for example\n"
            f"- `kvtier simulate --trace TRACE --sweep --policy lru --json > {folder}/lru.json` "
            "(and `--policy belady` for the bound): hit ratio against GPU capacity;\n"
            f"- `kvtier simulate --trace TRACE --gpu-tokens G --cpu-tokens C --policy arc --json > "
            f"{folder}/arc-C.json`, one file per CPU size: hit ratio against CPU capacity.\n\n"
            "This page then draws one line per policy, the Belady bound dashed.")
        return
    points = results.points
    for tier in ("cpu", "gpu", "cold"):
        part = points[points["tier"] == tier]
        if len(part):
            st.subheader(f"Hit ratio against {tier.upper()} capacity")
            chart(part.sort_values(["policy", "capacity_tokens"]),
                  charts.whatif_curves(tier, sorted(part["policy"].unique())))
    for note in results.notes:
        st.caption(note)
    st.caption("Sources: " + ", ".join(f"`{p.name}`" for p in results.files))
    st.dataframe(results.points, hide_index=True)
