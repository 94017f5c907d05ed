"""The dashboard's data layer: Parquet segments opened in an in-memory DuckDB.

The dashboard never opens the collector's store file (DuckDB's writer lock would block the
collector, or the dashboard); it reads the immutable segments the store exports
(``collector/segments.py``). Every page asks for aggregates computed in SQL; raw events are
never loaded into Python, so ten million block events cost one scan, not ten million rows.

Views defined on the connection:

* ``raw_events``: block events (``kind`` and ``tier_from`` as text);
* ``events``: the same, each with the ``tier_config`` of its request (an as-of join by
  instance, request id and time, see ``with_config``; ``(unlabelled)`` without a record);
* ``requests``: request records; ``request_configs``: their ids, arrivals and configurations;
* ``metric_intervals``: the engines' scraped Prometheus metrics, ``time_s`` the interval's end
  (no tier configuration: a scrape does not say which requests it counted).
* ``tier_moves``: the guardrail's pauses and resumes (``tier`` as text), the operators' and
  what the engines applied.

A view exists only when its table has segments (``SegmentData.has_events`` / ``has_requests``).

The same requests may be recorded twice: by the engine that served them and by a client that
sent them (kvtier's load probe, engine ``load-probe``: the demo and ``kvtier load`` store
both). The two cannot be paired (each names the request its own way), so every figure reads
one observer per tier configuration, through ``SegmentData.requests``: the engine's records
for how prompts were served (tiers, hit ratio, block hashes, request counts), the client's
for the latency it saw (TTFT, ITL); the other observer only where the preferred one recorded
nothing in that configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd

from kvtier.collector.events import CLIENT_ENGINES
from kvtier.collector.ddl import (
    BLOCK_EVENTS_TABLE,
    METRIC_INTERVALS_TABLE,
    REQUESTS_TABLE,
    TIER_MOVES_TABLE,
)
from kvtier.collector.segments import has_segments, segments_relation

UNLABELLED = "(unlabelled)"
# Engines whose records come from replays rather than a serving engine: their latencies are
# modelled, not measured.
SIMULATED_ENGINES = frozenset({"trace-replay", "simulator"})
# A lookup stamped up to this long before its request's recorded arrival still belongs to it.
ARRIVAL_SLACK_S = 1.0
# What a figure reads request records for, and so which observer it prefers.
SERVED, SEEN = "served", "seen"
# Bucket widths the overview picks from, so axes read in round units.
NICE_BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


@dataclass(frozen=True)
class Filters:
    """What the sidebar selects. Empty tuples mean "all"; times are Unix seconds, the range
    is ``[start_s, end_s]`` and either end may be ``None`` (open)."""

    engines: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()
    tier_configs: tuple[str, ...] = ()
    start_s: float | None = None
    end_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("engines", "instances", "tier_configs"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"Filters.{name} must be a tuple of strings, got {value!r}")
        for name in ("start_s", "end_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"Filters.{name} must be a finite number of seconds or None, got {value!r}")
        if self.start_s is not None and self.end_s is not None and self.start_s > self.end_s:
            raise ValueError(f"Filters.start_s {self.start_s} is after end_s {self.end_s}")


class SegmentData:
    """Read-only queries over a segment root (``ROOT/{block_events,requests}/...``).

    Holds its own in-memory DuckDB connection; call ``close()`` (or use ``with``). The root
    may be missing or empty: the data is then empty, not an error.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.con = duckdb.connect()
        self.has_events = self.root.is_dir() and has_segments(self.root, BLOCK_EVENTS_TABLE)
        self.has_requests = self.root.is_dir() and has_segments(self.root, REQUESTS_TABLE)
        self.has_metrics = self.root.is_dir() and has_segments(self.root, METRIC_INTERVALS_TABLE)
        self.has_moves = self.root.is_dir() and has_segments(self.root, TIER_MOVES_TABLE)
        self._define_views()

    def _define_views(self) -> None:
        self.con.execute("SET enable_progress_bar = false")
        if self.has_requests:
            self.con.execute("CREATE VIEW requests AS SELECT * REPLACE "
                             f"(coalesce(tier_config_id, '{UNLABELLED}') AS tier_config_id) "
                             f"FROM {segments_relation(self.root, REQUESTS_TABLE)}")
            self.con.execute("""CREATE VIEW request_configs AS
                SELECT instance, request_id, arrival_s, tier_config_id AS tier_config
                FROM requests WHERE request_id IS NOT NULL""")
        if self.has_metrics:  # an interval counts at its end, when the engine had counted it
            self.con.execute("CREATE VIEW metric_intervals AS SELECT *, end_s AS time_s "
                             f"FROM {segments_relation(self.root, METRIC_INTERVALS_TABLE)}")
        if self.has_moves:
            self.con.execute("CREATE VIEW tier_moves AS SELECT * REPLACE (CAST(tier AS VARCHAR) "
                             f"AS tier) FROM {segments_relation(self.root, TIER_MOVES_TABLE)}")
        if not self.has_events:
            return
        self.con.execute(f"""CREATE VIEW raw_events AS
            SELECT * REPLACE (CAST(kind AS VARCHAR) AS kind, CAST(tier_from AS VARCHAR) AS tier_from)
            FROM {segments_relation(self.root, BLOCK_EVENTS_TABLE)}""")
        self.con.execute(f"CREATE VIEW events AS {self.with_config('raw_events')}")

    def with_config(self, relation: str) -> str:
        """SQL adding ``tier_config`` (of each row's request) to a relation that has
        ``instance``, ``request_id`` and ``time_s``. Joining costs a probe per row:
        aggregate first.

        Request ids may repeat (a replayed trace runs the same requests once per tier
        configuration), so a row belongs to the latest request with its id that arrived at
        or before it (an as-of join), with ``ARRIVAL_SLACK_S`` of tolerance for events
        stamped by another clock than the request's arrival."""
        if not self.has_requests:
            return f"SELECT e.*, '{UNLABELLED}' AS tier_config FROM {relation} e"
        return (f"SELECT e.*, coalesce(c.tier_config, '{UNLABELLED}') AS tier_config FROM {relation} e "
                "ASOF LEFT JOIN request_configs c ON c.instance = e.instance AND c.request_id = e.request_id "
                f"AND e.time_s + {ARRIVAL_SLACK_S} >= c.arrival_s")

    def requests(self, filters: Filters, purpose: str) -> tuple[str, list]:
        """A relation (SQL, parameters) of the request records ``filters`` select, each
        request once: per tier configuration, for ``SERVED`` (tiers, blocks, counts) the
        engine's records where it has any, for ``SEEN`` (TTFT/ITL) the client's where it has
        any with a TTFT; the other observer's otherwise. Filters apply first, so choosing an
        engine in the sidebar shows that engine's records."""
        if purpose not in (SERVED, SEEN):
            raise ValueError(f"purpose must be {SERVED!r} or {SEEN!r}, got {purpose!r}")
        where, params = self.where(filters, "requests")
        client = "coalesce(engine IN ({}), false)".format(", ".join(f"'{e}'" for e in sorted(CLIENT_ENGINES)))
        keep = f"NOT {client}" if purpose == SERVED else client
        preferred = keep if purpose == SERVED else f"{client} AND ttft_s IS NOT NULL"
        return (f"""(SELECT * EXCLUDE (has_preferred) FROM (
                SELECT *, bool_or({preferred}) OVER (PARTITION BY tier_config_id) AS has_preferred
                FROM requests {where})
            WHERE {keep} OR NOT coalesce(has_preferred, false))""", params)

    def events_view(self, filters: Filters) -> str:
        """``events`` when the filters need each event's tier configuration, else the
        cheaper ``raw_events`` (no join)."""
        return "events" if filters.tier_configs else "raw_events"

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> SegmentData:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ queries

    def df(self, sql: str, params: list | None = None) -> pd.DataFrame:
        """Run an aggregate query and return its (small) result as a DataFrame."""
        return self.con.execute(sql, params or []).df()

    def where(self, filters: Filters, view: str) -> tuple[str, list]:
        """A ``WHERE`` clause (and its parameters) applying ``filters`` to a view
        (``events``/``raw_events``/``requests``/``metric_intervals``/``tier_moves``).
        ``raw_events``, ``metric_intervals`` and ``tier_moves`` have no ``tier_config``, so the
        configuration filter is left out there: apply it after joining (``with_config``)."""
        time_col = "arrival_s" if view == "requests" else "time_s"
        config_col = "tier_config_id" if view == "requests" else "tier_config"
        pairs = [("engine", filters.engines), ("instance", filters.instances)]
        if view in ("events", "requests"):  # the views that know each row's configuration
            pairs.append((config_col, filters.tier_configs))
        clauses, params = [], []
        for column, values in pairs:
            if values:
                clauses.append(f"list_contains(?::VARCHAR[], {column})")
                params.append(list(values))
        if filters.start_s is not None:
            clauses.append(f"{time_col} >= ?")
            params.append(filters.start_s)
        if filters.end_s is not None:
            clauses.append(f"{time_col} <= ?")
            params.append(filters.end_s)
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


def segment_signature(root: str | Path) -> tuple[int, float]:
    """(file count, newest modification time) of the segments under ``root``: it changes
    whenever the collector exports, so it keys cached results. Segments are never rewritten."""
    count, newest = 0, 0.0
    for path in Path(root).rglob("*.parquet") if Path(root).is_dir() else ():
        try:
            newest = max(newest, path.stat().st_mtime)
        except OSError:  # removed by retention while listing
            continue
        count += 1
    return count, newest


def bucket_width_s(start_s: float | None, end_s: float | None, target_buckets: int = 60) -> int:
    """A round bucket width giving about ``target_buckets`` buckets over the span."""
    if target_buckets < 1:
        raise ValueError(f"target_buckets must be >= 1, got {target_buckets}")
    span = (end_s - start_s) if start_s is not None and end_s is not None else 0.0
    wanted = span / target_buckets
    return next((b for b in NICE_BUCKETS_S if b >= wanted), NICE_BUCKETS_S[-1])


def and_where(where: str, clause: str) -> str:
    """``where`` (possibly empty) with one more clause."""
    return f"{where} AND {clause}" if where else f"WHERE {clause}"


def empty_frame(*columns: str) -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in columns})
