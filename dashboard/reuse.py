"""Reuse analysis in SQL: which blocks are shared, how soon they come back, which never do.

Every query works from "block uses": one row per block a request needed, with its time and
position in the prompt. They come from lookup events (GPU hit, CPU/cold promotion,
recompute miss) when the segments have block events, else from the requests' own
``block_hashes`` (position = index in the prompt, time = arrival).
"""

from __future__ import annotations

import pandas as pd

from dashboard.data import Filters, SegmentData, and_where, empty_frame
from dashboard.queries import REUSE_CLASSES

_LOOKUPS = "('gpu_hit', 'cpu_promotion', 'cold_promotion', 'recompute_miss')"
# Reuse-time histogram edges: log10 of seconds, quarter-decade bins from 1 ms to ~1 day.
_LOG_BIN = 0.25
_LOG_MIN, _LOG_MAX = -3.0, 5.0
# Prompt positions beyond this are pooled into the last row of the shared-prefix chart.
MAX_POSITION = 64


def block_uses(data: SegmentData, filters: Filters) -> tuple[str, list] | None:
    """SQL (and parameters) for block uses: ``block_hash``, ``request_id``, ``time_s``,
    ``position``; ``None`` when there is no data."""
    if data.has_events:
        view = data.events_view(filters)
        where, params = data.where(filters, view)
        return (f"SELECT block_hash, request_id, time_s, position FROM {view} "
                f"{and_where(where, f'kind IN {_LOOKUPS}')}", params)
    if data.has_requests:
        where, params = data.where(filters, "requests")
        return (f"""SELECT unnest(block_hashes) AS block_hash, request_id, arrival_s AS time_s,
                    unnest(generate_series(0, len(block_hashes) - 1)) AS position
                FROM requests {and_where(where, 'len(block_hashes) > 0')}""", params)
    return None


def reuse_classes(data: SegmentData, filters: Filters) -> pd.DataFrame:
    """Blocks by how many distinct requests used them: ``reuse_class``, ``blocks``, ``rank``."""
    uses = block_uses(data, filters)
    if uses is None:
        return empty_frame("reuse_class", "blocks", "rank")
    sql, params = uses
    cases = " ".join(f"WHEN n >= {low} THEN {rank}" for rank, (_, low) in reversed(list(enumerate(REUSE_CLASSES))))
    frame = data.df(f"""SELECT CASE {cases} END AS rank, count(*) AS blocks
        FROM (SELECT block_hash, count(DISTINCT request_id) AS n FROM ({sql}) GROUP BY block_hash)
        GROUP BY rank ORDER BY rank""", params)
    frame["reuse_class"] = [REUSE_CLASSES[int(r)][0] for r in frame["rank"]]
    return frame[["reuse_class", "blocks", "rank"]]


def reuse_gaps(data: SegmentData, filters: Filters) -> pd.DataFrame:
    """Histogram of time between consecutive uses of the same block (by another request):
    ``gap_s`` and ``gap_end_s`` (bin edges, seconds, log-spaced), ``uses``."""
    uses = block_uses(data, filters)
    if uses is None:
        return empty_frame("gap_s", "gap_end_s", "uses")
    sql, params = uses
    return data.df(f"""SELECT pow(10, b * {_LOG_BIN}) AS gap_s, pow(10, (b + 1) * {_LOG_BIN}) AS gap_end_s,
            count(*) AS uses FROM (
            SELECT floor(greatest(least(log10(greatest(gap, 1e-9)), {_LOG_MAX}), {_LOG_MIN}) / {_LOG_BIN}) AS b
            FROM (SELECT time_s - lag(time_s) OVER (PARTITION BY block_hash ORDER BY time_s) AS gap
                  FROM (SELECT block_hash, request_id, min(time_s) AS time_s FROM ({sql}) GROUP BY ALL))
            WHERE gap IS NOT NULL)
        GROUP BY b ORDER BY b""", params)


def shared_by_position(data: SegmentData, filters: Filters) -> pd.DataFrame:
    """Share of blocks used by more than one request, by block position in the prompt:
    ``position``, ``blocks``, ``shared_share``. Shared prefixes show as a high share at low
    positions."""
    uses = block_uses(data, filters)
    if uses is None:
        return empty_frame("position", "blocks", "shared_share")
    sql, params = uses
    return data.df(f"""SELECT least(position, {MAX_POSITION}) AS position, count(*) AS blocks,
            avg(CASE WHEN n > 1 THEN 1.0 ELSE 0.0 END) AS shared_share
        FROM (SELECT block_hash, min(position) AS position, count(DISTINCT request_id) AS n
              FROM ({sql}) WHERE position IS NOT NULL GROUP BY block_hash)
        GROUP BY ALL ORDER BY position""", params)


def stores_never_promoted(data: SegmentData, filters: Filters) -> dict:
    """Blocks written to a lower tier (``store``) and how many were never promoted back:
    the offload traffic that bought nothing. Keys ``stored_blocks``, ``never_promoted``."""
    if not data.has_events:
        return {"stored_blocks": 0, "never_promoted": 0}
    view = data.events_view(filters)
    where, params = data.where(filters, view)
    row = data.df(f"""SELECT count(*) AS stored_blocks, count(*) FILTER (WHERE NOT promoted) AS never_promoted
        FROM (SELECT block_hash, bool_or(kind IN ('cpu_promotion', 'cold_promotion')) AS promoted
              FROM {view} {where} GROUP BY block_hash HAVING bool_or(kind = 'store'))""", params)
    return {k: int(row[k].iloc[0]) for k in ("stored_blocks", "never_promoted")}
