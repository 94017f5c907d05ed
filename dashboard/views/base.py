"""What every page shares: its context, the chart call, and the explanations shown instead
of an empty chart."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from kvtier.dashboard import crosschecks, queries, reuse
from kvtier.dashboard.data import Filters, SegmentData
from kvtier.dashboard.facets import Facets
from kvtier.dashboard.sources import DashboardConfig

# A tier configuration with fewer requests than this is reported as still rolling out and
# its percentiles as provisional.
MIN_PHASE_REQUESTS = 30


# The aggregate queries pages may run, by name: each is ``fn(data, filters, *args)``.
QUERIES = {
    "hit_quality": queries.hit_quality,
    "load_wait": queries.load_wait,
    "copy_time": queries.copy_time,
    "request_latency": queries.request_latency,
    "size_latency": queries.size_latency,
    "latency_over_time": queries.latency_over_time,
    "tier_moves": queries.tier_moves,
    "reuse": reuse.reuse_figures,
    "crosschecks": crosschecks.crosschecks,
}


@st.cache_data(max_entries=64, show_spinner=False)
def _cached(name: str, root: str, signature: tuple[int, float], filters: tuple, args: tuple):
    # Keyed by the segment signature: new segments make a new entry, so results never go stale.
    with SegmentData(root) as data:
        return QUERIES[name](data, Filters(*filters), *args)


@dataclass(frozen=True)
class PageContext:
    """What a page renders from. ``signature`` identifies the segments' current contents."""

    facets: Facets
    filters: Filters
    config: DashboardConfig
    signature: tuple[int, float]

    def query(self, name: str, *args):
        """Run ``QUERIES[name]`` on the selection, cached until new segments arrive."""
        return _cached(name, str(self.config.segments), self.signature,
                       dataclasses.astuple(self.filters), args)


def chart(frame: pd.DataFrame, spec: dict, *, stretch: bool = True) -> None:
    """Draw a Vega-Lite chart over a small aggregate frame."""
    st.vega_lite_chart(frame, spec, width="stretch" if stretch else "content")


def explain_no_data(config: DashboardConfig) -> None:
    st.info(
        f"No segments yet under `{config.segments}`: nothing to chart.\n\n"
        "Segments are Parquet files the collector exports from its store. To produce some:\n"
        "- `kvtier demo --out kvtier-out` replays bundled real traces through the reference engine and writes "
        "`kvtier-out/segments`, then `kvtier dashboard --segments kvtier-out/segments`;\n"
        "- or run `kvtier collect` next to your engines, which exports segments as it ingests.")


def rollout_in_progress(facets: Facets) -> str | None:
    """A sentence when the newest tier configuration has too few requests to judge."""
    phases = facets.phases
    if len(phases) < 2:
        return None
    newest = phases.iloc[-1]
    if newest["requests"] >= MIN_PHASE_REQUESTS:
        return None
    return (f"Rollout in progress: the newest tier configuration `{newest['tier_config']}` has only "
            f"{int(newest['requests'])} request(s) so far (fewer than {MIN_PHASE_REQUESTS}); its "
            "shares and percentiles are provisional. Earlier phases: "
            + ", ".join(f"`{c}`" for c in phases["tier_config"].iloc[:-1]) + ".")
