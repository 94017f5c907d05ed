"""Live curves: each instance's token hit ratio at a ladder of CPU (and file) tier sizes, as
the collectors keep them at ingest (``kvtier collect --live-curves``), per window; the CPU
size for 80-99% of the hits a CPU tier adds; and the headroom signal. Read through policy's
typed curve values."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from kvtier.dashboard import charts
from kvtier.dashboard.views.base import PageContext, chart
from kvtier.policy.livecurve.curve_values import ALL, InstanceCurves, read_live_curves

GIB = 1 << 30


def render(ctx: PageContext) -> None:
    folder = ctx.config.live_curves
    try:
        curves = read_live_curves(folder)
    except FileNotFoundError:
        st.info(
            f"No live curves under `{folder}` yet.\n\n"
            "`kvtier collect --live-curves --curve-gpu-tokens TOKENS --segments DIR` keeps each "
            "instance's hit ratio at a ladder of CPU-tier sizes as it ingests, and writes them to "
            "`DIR/live_curves/` at each segment export (vLLM's GPU size is read from its "
            "`/metrics` when the collector scrapes it).")
        return
    except ValueError as error:
        st.error(str(error))
        return
    shown = [c for c in curves if _selected(c, ctx)]
    for c in shown:
        if c.note:
            st.warning(f"`{c.engine}/{c.instance}`: {c.note}")
    sized = [c for c in shown if c.windows]
    if not sized:
        st.info("No instance in the selection has a curve yet.")
        return
    windows = list(dict.fromkeys(w.window for c in sized for w in c.windows))
    window = st.radio("Window", windows, index=windows.index(ALL) if ALL in windows else 0,
                      horizontal=True, key="live_window")
    points = _points(sized, window)
    for tier in ("cpu", "cold"):
        part = points[points["tier"] == tier]
        if len(part):
            st.subheader(f"Hit ratio against {tier.upper()} tier size ({window})")
            chart(part.sort_values(["instance", "size_gib"]), charts.live_curves(tier.upper()))
    st.subheader("CPU tier for a share of the reachable hits, and headroom")
    st.dataframe(_summary(sized, window), hide_index=True)
    st.caption("Reachable hits: those a CPU tier up to the largest ladder size adds. Headroom: "
               "how many times the arrival rate fits in the p99 TTFT budget under the queue "
               "model, with the tiers as they serve and with the offload tiers' tokens "
               "recomputed; 'default' costs are kvtier's assumptions, not this engine's.")


def _selected(curve: InstanceCurves, ctx: PageContext) -> bool:
    engines, instances = ctx.filters.engines, ctx.filters.instances
    return (not engines or curve.engine in engines) and (not instances or curve.instance in instances)


def _points(curves, window: str) -> pd.DataFrame:
    rows = [{"instance": f"{c.engine}/{c.instance}", "tier": p.tier, "size_tokens": p.size_tokens,
             "size_gib": p.size_bytes / GIB, "hit_ratio": p.hit_ratio}
            for c in curves if (w := c.window(window)) is not None for p in w.points]
    return pd.DataFrame(rows, columns=["instance", "tier", "size_tokens", "size_gib", "hit_ratio"])


def _summary(curves, window: str) -> pd.DataFrame:
    rows = []
    for c in curves:
        w = c.window(window)
        if w is None:
            continue
        row = {"instance": f"{c.engine}/{c.instance}", "semantics": c.semantics,
               "GPU tokens": f"{c.gpu_tokens:,} ({c.gpu_source})", "requests": w.requests,
               "GPU alone": round(w.gpu_hit_ratio, 4),
               "largest CPU size": round(max((p.hit_ratio for p in w.points if p.tier == "cpu"),
                                             default=0.0), 4)}
        row.update({f"{r.percent}% (GiB)": round(r.size_bytes / GIB, 3) for r in w.reach})
        room = c.headroom
        if room is not None:
            row.update({"load factor": round(room.load_factor, 2),
                        "without offload": round(room.load_factor_without_offload, 2),
                        "costs": room.costs,
                        "CPU tokens/s saved": round(room.saved_tokens_per_s.get("cpu", 0.0), 1)})
        rows.append(row)
    return pd.DataFrame(rows)
