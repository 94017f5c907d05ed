"""The Streamlit script: sidebar (page, filters), then the chosen page.

Run by ``kvtier dashboard`` (``streamlit run dashboard/app.py -- --segments DIR``). The page
can be chosen with ``?page=overview|latency|reuse|whatif|recommendation``.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta

import streamlit as st

from kvtier.dashboard.data import Filters, SegmentData, segment_signature
from kvtier.dashboard.facets import Facets, read_facets
from kvtier.dashboard.sources import DashboardConfig
from kvtier.dashboard.views import PAGES, PageContext, explain_no_data


def main() -> None:
    st.set_page_config(page_title="kvtier", layout="wide")
    config = DashboardConfig.from_sources(sys.argv[1:], os.environ)
    slug = _choose_page()
    signature = segment_signature(config.segments)
    facets = _facets(str(config.segments), signature)
    filters = _filters(facets)
    title, render = PAGES[slug]
    st.title(f"kvtier · {title}")
    if facets.empty and slug in ("overview", "latency", "reuse"):
        explain_no_data(config)
        return
    _notices(facets)
    render(PageContext(facets, filters, config, signature))


@st.cache_data(max_entries=16, show_spinner=False)
def _facets(root: str, signature: tuple[int, float]) -> Facets:
    """Facets of the segments, recomputed only when ``signature`` (new segments) changes."""
    with SegmentData(root) as data:
        return read_facets(data)


def _choose_page() -> str:
    slugs = list(PAGES)
    wanted = st.query_params.get("page", "overview")
    index = slugs.index(wanted) if wanted in slugs else 0
    slug = st.sidebar.radio("Page", slugs, index=index, format_func=lambda s: PAGES[s][0], key="page")
    st.query_params["page"] = slug
    return slug


def _filters(facets: Facets) -> Filters:
    """Sidebar filters; empty selections mean "all"."""
    side = st.sidebar
    side.header("Filters")
    engines = side.multiselect("Engine", facets.engines, placeholder="all engines")
    instances = side.multiselect("Instance", facets.instances, placeholder="all instances")
    configs = side.multiselect("Tier configuration", facets.tier_configs, placeholder="all configurations")
    start_s, end_s = _time_range(facets)
    return Filters(tuple(engines), tuple(instances), tuple(configs), start_s, end_s)


def _time_range(facets: Facets) -> tuple[float | None, float | None]:
    if facets.start_s is None or facets.end_s is None or facets.end_s - facets.start_s < 1:
        return None, None
    lo = datetime.fromtimestamp(int(facets.start_s), UTC).replace(tzinfo=None)
    hi = datetime.fromtimestamp(int(facets.end_s) + 1, UTC).replace(tzinfo=None)
    picked = st.sidebar.slider("Time range (UTC)", min_value=lo, max_value=hi, value=(lo, hi),
                               step=timedelta(seconds=1), format="MM-DD HH:mm")
    if picked == (lo, hi):
        return None, None  # the whole span: no filter, so new segments are included
    return tuple(p.replace(tzinfo=UTC).timestamp() for p in picked)


def _notices(facets: Facets) -> None:
    if facets.simulated_only:
        st.info(f"All data here comes from simulated replays (engine: {', '.join(facets.engines)}). "
                "Hit quality is what the replay produced; latencies, where shown, are modelled, not "
                "measured on a serving engine.")


main()
