"""What the segments hold (engines, instances, configurations, time span, counts): the
sidebar's options and the choice between a chart and an explanation.

Block-event facets come from the Parquet footers (row counts, min/max statistics of
``time_s`` and ``engine``) and the hive paths, not from a scan: at ten million events that
is milliseconds instead of most of a second. Files without usable statistics (written by
another tool, or holding several engines) fall back to a scan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from kvtier.collector.ddl import BLOCK_EVENTS_TABLE
from kvtier.collector.segments import segment_glob
from kvtier.dashboard.data import SERVED, SIMULATED_ENGINES, UNLABELLED, Filters, SegmentData


@dataclass(frozen=True)
class Facets:
    """``tier_configs`` are in rollout order (first request seen first); ``phases`` has one
    row per tier configuration: ``tier_config``, ``first_s``, ``last_s``, ``requests``."""

    engines: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()
    tier_configs: tuple[str, ...] = ()
    start_s: float | None = None
    end_s: float | None = None
    block_events: int = 0
    requests: int = 0
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def empty(self) -> bool:
        return self.block_events == 0 and self.requests == 0

    @property
    def simulated_only(self) -> bool:
        """True when every engine in the data is a replay (latencies are modelled)."""
        return bool(self.engines) and set(self.engines) <= SIMULATED_ENGINES


def read_facets(data: SegmentData) -> Facets:
    """The facets of everything under ``data``'s root (no filters)."""
    spans = []
    if data.has_events:
        spans.append(_event_spans_from_footers(data))
    if data.has_requests:
        spans.append(data.df("SELECT engine, instance, min(arrival_s) AS lo, max(arrival_s) AS hi, "
                             "count(*) AS n, 'requests' AS t FROM requests GROUP BY ALL"))
    if not spans:
        return Facets()
    spans = pd.concat(spans, ignore_index=True)
    counts = spans.groupby("t")["n"].sum()
    phases = read_phases(data) if data.has_requests else pd.DataFrame()
    return Facets(
        engines=tuple(sorted(spans["engine"].dropna().unique())),
        instances=tuple(sorted(spans["instance"].dropna().unique())),
        tier_configs=tuple(phases["tier_config"]) if len(phases) else (UNLABELLED,),
        start_s=_float(spans["lo"].min()), end_s=_float(spans["hi"].max()),
        block_events=int(counts.get("events", 0)),
        requests=int(phases["requests"].sum()) if len(phases) else 0,  # each request once
        phases=phases)


def read_phases(data: SegmentData, filters: Filters | None = None) -> pd.DataFrame:
    """One row per tier configuration in rollout order: first/last arrival, requests (each
    counted once, see :meth:`SegmentData.requests`)."""
    relation, params = data.requests(filters or Filters(), SERVED)
    return data.df(f"""SELECT tier_config_id AS tier_config, min(arrival_s) AS first_s,
            max(arrival_s) AS last_s, count(*) AS requests
        FROM {relation} GROUP BY ALL ORDER BY first_s, tier_config""", params)


def _event_spans_from_footers(data: SegmentData) -> pd.DataFrame:
    glob = segment_glob(data.root, BLOCK_EVENTS_TABLE).replace("'", "''")
    spans = data.df(f"""
        WITH files AS (
            SELECT filename, instance, count(*) AS n
            FROM read_parquet('{glob}', hive_partitioning = true, union_by_name = true, filename = true)
            GROUP BY ALL),
        stats AS (
            SELECT file_name,
                   min(TRY_CAST(stats_min_value AS DOUBLE)) FILTER (WHERE path_in_schema = 'time_s') AS lo,
                   max(TRY_CAST(stats_max_value AS DOUBLE)) FILTER (WHERE path_in_schema = 'time_s') AS hi,
                   min(stats_min_value) FILTER (WHERE path_in_schema = 'engine') AS engine,
                   max(stats_max_value) FILTER (WHERE path_in_schema = 'engine') AS engine_max
            FROM parquet_metadata('{glob}') GROUP BY file_name)
        SELECT f.instance, s.engine, s.engine_max, s.lo, s.hi, f.n
        FROM files f LEFT JOIN stats s ON s.file_name = f.filename""")
    usable = (spans["engine"].notna() & (spans["engine"] == spans["engine_max"])
              & spans["lo"].notna() & spans["hi"].notna())
    if len(spans) and not usable.all():
        return data.df("SELECT engine, instance, min(time_s) AS lo, max(time_s) AS hi, count(*) AS n, "
                       "'events' AS t FROM raw_events GROUP BY ALL")
    spans = spans.groupby(["engine", "instance"], as_index=False).agg(lo=("lo", "min"), hi=("hi", "max"),
                                                                       n=("n", "sum"))
    spans["t"] = "events"
    return spans


def _float(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)
