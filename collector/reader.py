"""The store and its Parquet segments as ``TraceReader``s: request records for ``policy/``.

A request's ``block_hashes`` come from its record when the probe stored them; otherwise
they are rebuilt from the request's lookup events (GPU hit, CPU/cold promotion, recompute
miss) ordered by position in the prompt, matched by source (the recorder that wrote both)
and request id, so replays that reuse a trace's request ids never mix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import duckdb

from collector.columns import REQUEST_COLUMNS
from collector.ddl import BLOCK_EVENTS_TABLE, REQUESTS_TABLE, WITH_ORIGIN
from collector.events import LOOKUP_OUTCOMES, RequestRecord
from collector.segments import has_segments, segments_relation
from collector.store import TraceStore

_FIELDS = [c.name for c in REQUEST_COLUMNS]
_LOOKUP_LABELS = ", ".join(f"'{o.label}'" for o in sorted(LOOKUP_OUTCOMES))


def requests_sql(requests: str, block_events: str | None, where: str = "") -> str:
    """SQL yielding request rows (schema fields, in arrival order) over two relations."""
    fields = ", ".join(f"r.{name}" for name in _FIELDS if name != "block_hashes")
    if block_events is None:
        hashes = "r.block_hashes"
        join = ""
    else:
        hashes = ("CASE WHEN len(r.block_hashes) > 0 THEN r.block_hashes "
                  "ELSE coalesce(lk.hashes, []::UBIGINT[]) END")
        join = f"""LEFT JOIN (
            SELECT source, request_id, list(block_hash ORDER BY position, time_s) AS hashes
            FROM {block_events}
            WHERE request_id IS NOT NULL AND CAST(kind AS VARCHAR) IN ({_LOOKUP_LABELS})
            GROUP BY source, request_id) lk
          ON lk.source = r.source AND lk.request_id = r.request_id"""
    return (f"SELECT {fields}, {hashes} AS block_hashes FROM {requests} r {join} {where} "
            "ORDER BY r.arrival_s, r.batch_id")


def _records(table) -> Iterator[RequestRecord]:
    for batch in table.to_batches(max_chunksize=4096):
        for row in batch.to_pylist():
            row["block_hashes"] = tuple(row["block_hashes"] or ())
            yield RequestRecord(**{name: row[name] for name in _FIELDS})


def _config_filter(tier_config_id: str | None) -> tuple[str, list]:
    if tier_config_id is None:
        return "", []
    return "WHERE r.tier_config_id = ?", [tier_config_id]


class StoreReader:
    """Request records from a live ``TraceStore`` (in the writer's own process)."""

    def __init__(self, store: TraceStore, *, tier_config_id: str | None = None):
        self.store = store
        self.tier_config_id = tier_config_id

    def requests(self) -> Iterator[RequestRecord]:
        where, params = _config_filter(self.tier_config_id)
        sql = requests_sql(WITH_ORIGIN[REQUESTS_TABLE], WITH_ORIGIN[BLOCK_EVENTS_TABLE], where)
        yield from _records(self.store.query(sql, params))


class SegmentReader:
    """Request records from Parquet segments (any number of instances and days).

    Opens its own in-memory DuckDB, so it never touches a writer's lock.
    """

    def __init__(self, root: str | Path, *, tier_config_id: str | None = None):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(2, "no segment folder", str(self.root))
        self.tier_config_id = tier_config_id

    def requests(self) -> Iterator[RequestRecord]:
        if not has_segments(self.root, REQUESTS_TABLE):
            return
        con = duckdb.connect()
        try:
            events = (segments_relation(self.root, BLOCK_EVENTS_TABLE)
                      if has_segments(self.root, BLOCK_EVENTS_TABLE) else None)
            where, params = _config_filter(self.tier_config_id)
            sql = requests_sql(segments_relation(self.root, REQUESTS_TABLE), events, where)
            yield from _records(con.sql(sql, params=params or None).to_arrow_table())
        finally:
            con.close()
