"""Reuse analysis in SQL: which blocks are shared, how soon they come back, which never do.

Everything works from "block uses": one row per lookup of a block (GPU hit, CPU/cold
promotion, recompute miss) with its time and position in the prompt, from block events
when the segments have them, else from the requests' own ``block_hashes`` (position = index
in the prompt, time = arrival). A block is *reused* when it is looked up more than once
within one tier configuration: a rollout replays the same traffic once per configuration
(and a new configuration starts with empty tiers), so a use in another configuration is no
reuse a cache could have served. "Distinct blocks" are counted the same way, per
configuration.

``ReuseAnalysis`` groups the uses by block once (a temporary table on the data's
connection); the charts are then small queries over that summary, so ten million uses cost
one hash aggregation, not one per chart.
"""

from __future__ import annotations

import pandas as pd

from kvtier.dashboard.data import SERVED, UNLABELLED, Filters, SegmentData, and_where, empty_frame
from kvtier.dashboard.queries import REUSE_CLASSES

_LOOKUPS = "('gpu_hit', 'cpu_promotion', 'cold_promotion', 'recompute_miss')"
# Reuse-time histogram edges: log10 of seconds, quarter-decade bins from 1 ms to ~1 day.
_LOG_BIN = 0.25
_LOG_MIN, _LOG_MAX = -3.0, 5.0
# Prompt positions beyond this are pooled into the last row of the shared-prefix chart.
MAX_POSITION = 64
_SUMMARY = "reuse_block_summary"


def block_uses(data: SegmentData, filters: Filters) -> tuple[str, list] | None:
    """SQL (and parameters) for block uses: ``tier_config``, ``block_hash``, ``time_s``,
    ``position``; ``None`` when there is no data."""
    if data.has_events:
        where, params = data.where(filters, "raw_events")
        lookups = f"SELECT * FROM raw_events {and_where(where, f'kind IN {_LOOKUPS}')}"
        # Each request's configuration, joined once per request (and second: ids recur per
        # configuration), then onto its lookups by equality, not one as-of probe per event.
        per_request = f"""SELECT instance, request_id, floor(time_s) AS second_s, min(time_s) AS time_s
            FROM ({lookups}) GROUP BY ALL"""
        configs = data.with_config(f"({per_request})")
        config_where, config_params = "", []
        if filters.tier_configs:
            config_where = "WHERE list_contains(?::VARCHAR[], c.tier_config)"
            config_params = [list(filters.tier_configs)]
        sql = f"""SELECT coalesce(c.tier_config, '{UNLABELLED}') AS tier_config, e.block_hash,
                e.time_s, e.position
            FROM ({lookups}) e LEFT JOIN ({configs}) c ON c.instance IS NOT DISTINCT FROM e.instance
                AND c.request_id IS NOT DISTINCT FROM e.request_id AND c.second_s = floor(e.time_s)
            {config_where}"""
        return sql, params + params + config_params
    if data.has_requests:
        relation, params = data.requests(filters, SERVED)  # each request once
        return (f"""SELECT tier_config_id AS tier_config, unnest(block_hashes) AS block_hash,
                    arrival_s AS time_s, unnest(generate_series(0, len(block_hashes) - 1)) AS position
                FROM {relation} WHERE len(block_hashes) > 0""", params)
    return None


class ReuseAnalysis:
    """The reuse figures for one selection. Builds its per-block summary on construction;
    ``empty`` is True when there are no block uses at all."""

    def __init__(self, data: SegmentData, filters: Filters):
        self.data = data
        uses = block_uses(data, filters)
        self.empty = uses is None
        if uses is None:
            return
        self._uses_sql, self._params = uses
        data.con.execute(f"""CREATE OR REPLACE TEMP TABLE {_SUMMARY} AS
            SELECT tier_config, block_hash, count(*) AS uses, min(position) AS position
            FROM ({self._uses_sql}) GROUP BY tier_config, block_hash""", self._params)
        self.empty = data.df(f"SELECT count(*) AS n FROM {_SUMMARY}")["n"].iloc[0] == 0

    def classes(self) -> pd.DataFrame:
        """Blocks by how many times they were used: ``reuse_class``, ``blocks``, ``rank``."""
        if self.empty:
            return empty_frame("reuse_class", "blocks", "rank")
        cases = " ".join(f"WHEN uses >= {low} THEN {rank}"
                         for rank, (_, low) in reversed(list(enumerate(REUSE_CLASSES))))
        frame = self.data.df(f"SELECT CASE {cases} END AS rank, count(*) AS blocks FROM {_SUMMARY} "
                             "GROUP BY rank ORDER BY rank")
        frame["reuse_class"] = [REUSE_CLASSES[int(r)][0] for r in frame["rank"]]
        return frame[["reuse_class", "blocks", "rank"]]

    def by_position(self) -> pd.DataFrame:
        """Share of blocks used more than once, by (first) position in the prompt:
        ``position``, ``blocks``, ``shared_share``. Shared prefixes show as a high share at
        low positions."""
        if self.empty:
            return empty_frame("position", "blocks", "shared_share")
        return self.data.df(f"""SELECT least(position, {MAX_POSITION}) AS position, count(*) AS blocks,
                avg(CASE WHEN uses > 1 THEN 1.0 ELSE 0.0 END) AS shared_share
            FROM {_SUMMARY} WHERE position IS NOT NULL GROUP BY ALL ORDER BY position""")

    def gaps(self) -> pd.DataFrame:
        """Histogram of the time between consecutive uses of the same block: ``gap_s`` and
        ``gap_end_s`` (bin edges, seconds, log-spaced), ``uses``. Only reused blocks are
        windowed, so unique blocks (usually most) cost nothing here."""
        if self.empty:
            return empty_frame("gap_s", "gap_end_s", "uses")
        return self.data.df(f"""SELECT pow(10, b * {_LOG_BIN}) AS gap_s, pow(10, (b + 1) * {_LOG_BIN}) AS gap_end_s,
                count(*) AS uses FROM (
                SELECT floor(greatest(least(log10(greatest(gap, 1e-9)), {_LOG_MAX}), {_LOG_MIN}) / {_LOG_BIN}) AS b
                FROM (SELECT time_s - lag(time_s) OVER (PARTITION BY tier_config, block_hash ORDER BY time_s) AS gap
                      FROM ({self._uses_sql}) u
                      SEMI JOIN (SELECT tier_config, block_hash FROM {_SUMMARY} WHERE uses > 1) r
                          USING (tier_config, block_hash))
                WHERE gap IS NOT NULL)
            GROUP BY b ORDER BY b""", self._params)


def stores_never_promoted(data: SegmentData, filters: Filters) -> dict:
    """Blocks written to a lower tier (``store`` into the CPU or cold tier) and how many
    were never promoted back: the offload traffic that bought nothing. Keys ``stored_blocks``, ``never_promoted``.
    Counted within each tier configuration, as reuse is: a store's configuration is its
    request's, or (engines store without naming a request) the one of the latest request
    that had arrived on its instance."""
    if not data.has_events:
        return {"stored_blocks": 0, "never_promoted": 0}
    where, params = data.where(filters, "raw_events")
    # A store into the GPU tier is a newly computed block, not offload traffic.
    kinds = "SELECT * FROM raw_events " + and_where(
        where, "(kind IN ('cpu_promotion', 'cold_promotion') OR (kind = 'store' "
               "AND coalesce(CAST(tier_to AS VARCHAR), '') <> 'gpu'))")
    if data.has_requests:
        labelled = f"""SELECT block_hash, kind, tier_config FROM ({data.with_config(f'({kinds})')})
                WHERE request_id IS NOT NULL
            UNION ALL
            SELECT e.block_hash, e.kind, coalesce(c.tier_config, '{UNLABELLED}') AS tier_config
                FROM ({kinds}) e ASOF LEFT JOIN request_configs c
                ON c.instance = e.instance AND e.time_s >= c.arrival_s
                WHERE e.request_id IS NULL"""
        params = params + params
    else:
        labelled = f"SELECT block_hash, kind, '{UNLABELLED}' AS tier_config FROM ({kinds})"
    config_where, config_params = "", []
    if filters.tier_configs:
        config_where = "WHERE list_contains(?::VARCHAR[], tier_config)"
        config_params = [list(filters.tier_configs)]
    row = data.df(f"""SELECT count(*) AS stored_blocks, count(*) FILTER (WHERE NOT promoted) AS never_promoted
        FROM (SELECT tier_config, block_hash, bool_or(kind <> 'store') AS promoted
              FROM ({labelled}) {config_where}
              GROUP BY tier_config, block_hash HAVING bool_or(kind = 'store'))""", params + config_params)
    return {k: int(row[k].iloc[0]) for k in ("stored_blocks", "never_promoted")}


def reuse_figures(data: SegmentData, filters: Filters) -> dict:
    """Everything the reuse page shows: ``classes``, ``by_position``, ``gaps`` (frames) and
    ``stores`` (dict); frames are empty when there are no block uses."""
    analysis = ReuseAnalysis(data, filters)
    return {"classes": analysis.classes(), "by_position": analysis.by_position(), "gaps": analysis.gaps(),
            "stores": stores_never_promoted(data, filters)}
