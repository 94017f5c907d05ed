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

from kvtier.collector.columns import REQUEST_COLUMNS
from kvtier.collector.ddl import BLOCK_EVENTS_TABLE, REQUESTS_TABLE, TABLE_COLUMNS, WITH_ORIGIN
from kvtier.collector.block_kinds import LOOKUP_OUTCOMES
from kvtier.collector.events import RequestRecord
from kvtier.collector.segments import has_segments, segments_of, segments_relation
from kvtier.collector.store import TraceStore
from kvtier.collector.storefile import StoreLockedError

_FIELDS = [c.name for c in REQUEST_COLUMNS]
QUIET = "SET enable_progress_bar = false"  # DuckDB draws it on stdout: maybe a --json answer
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


def _filters(tier_config_id: str | None, instance: str | None,
             engine: str | None = None) -> tuple[str, list]:
    conditions, params = [], []
    for column, value in (("tier_config_id", tier_config_id), ("instance", instance),
                          ("engine", engine)):
        if value is not None:
            conditions.append(f"r.{column} = ?")
            params.append(value)
    return ("WHERE " + " AND ".join(conditions) if conditions else ""), params


def _of_instance(relation: str, instance: str | None) -> str:
    if instance is None:
        return relation
    return f"(SELECT * FROM {relation} WHERE instance = '{instance.replace(chr(39), chr(39) * 2)}')"


class StoreReader:
    """Request records from a live ``TraceStore`` (in the writer's own process); with
    ``instance``, only that serving instance's; with ``engine``, only those an origin of that
    engine recorded (e.g. a load probe's rows beside the engine's own)."""

    def __init__(self, store: TraceStore, *, tier_config_id: str | None = None,
                 instance: str | None = None, engine: str | None = None):
        self.store = store
        self.tier_config_id = tier_config_id
        self.instance = instance
        self.engine = engine

    def requests(self) -> Iterator[RequestRecord]:
        where, params = _filters(self.tier_config_id, self.instance, self.engine)
        sql = requests_sql(WITH_ORIGIN[REQUESTS_TABLE],
                           _of_instance(WITH_ORIGIN[BLOCK_EVENTS_TABLE], self.instance), where)
        yield from _records(self.store.query(sql, params))


class SegmentReader:
    """Request records from Parquet segments (any number of instances and days).

    Opens its own in-memory DuckDB, so it never touches a writer's lock. ``note`` says why
    these segments are read (e.g. in place of a locked store), for the caller to show. With
    ``instance``, only that serving instance's (its hive partition).
    """

    def __init__(self, root: str | Path, *, tier_config_id: str | None = None,
                 note: str | None = None, instance: str | None = None,
                 engine: str | None = None):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(2, "no segment folder", str(self.root))
        self.tier_config_id = tier_config_id
        self.note = note
        self.instance = instance
        self.engine = engine

    def requests(self) -> Iterator[RequestRecord]:
        if not has_segments(self.root, REQUESTS_TABLE):
            return
        con = duckdb.connect()
        con.execute(QUIET)
        try:
            where, params = _filters(self.tier_config_id, self.instance, self.engine)
            try:
                events = (_of_instance(_with_all_columns(con, self.root, BLOCK_EVENTS_TABLE),
                                       self.instance)
                          if has_segments(self.root, BLOCK_EVENTS_TABLE) else None)
                sql = requests_sql(_with_all_columns(con, self.root, REQUESTS_TABLE), events, where)
                table = con.sql(sql, params=params or None).to_arrow_table()
            except duckdb.InvalidInputException as error:  # a damaged or foreign .parquet
                first = str(error).strip().splitlines()[0]
                raise ValueError(f"{self.root}: a segment file cannot be read ({first}); "
                                 "remove it or export the segments again") from None
            yield from _records(table)
        finally:
            con.close()


def _with_all_columns(con, root: Path, table: str) -> str:
    """The table's segments as a relation with every schema column: segments exported before
    a nullable column was added to the schema (immutable files) read it as NULL."""
    relation = segments_relation(root, table)
    have = {row[0]: row[1] for row in con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()}
    if any(c.name in have and have[c.name] != _sql_type(c) for c in TABLE_COLUMNS[table]):
        _name_the_odd_file(con, root, table)
    missing = [c for c in TABLE_COLUMNS[table] if c.name not in have and c.nullable]
    if not missing:
        return relation
    nulls = ", ".join(f"CAST(NULL AS {'VARCHAR' if c.enum_type else c.sql_type}) AS {c.name}"
                      for c in missing)
    return f"(SELECT *, {nulls} FROM {relation})"


def _sql_type(column) -> str:
    return "VARCHAR" if column.enum_type else column.sql_type


def _name_the_odd_file(con, root: Path, table: str) -> None:
    """Segments whose union changed a column's type: ``ValueError`` naming the first file
    that holds the column in another type (written by another program or schema)."""
    expected = {c.name: _sql_type(c) for c in TABLE_COLUMNS[table]}
    for path in sorted((root / table).rglob("*.parquet")):
        quoted = str(path).replace("'", "''")
        for name, sql_type, *_ in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{quoted}')").fetchall():
            if name in expected and sql_type != expected[name]:
                raise ValueError(f"{path}: column {name} is {sql_type} where kvtier's {table} have "
                                 f"{expected[name]} (a file another program or schema wrote); move "
                                 f"it out of {root}, or export the segments again")


def open_store(path: str | Path, *, tier_config_id: str | None = None,
               instance: str | None = None, engine: str | None = None):
    """A reader for a store file, opened read-only (the file stays byte-identical).

    A store locked by a running collector is read through the Parquet segments that collector
    exports (``SegmentReader.note`` says so), if they can be found; otherwise
    :class:`kvtier.collector.storefile.StoreLockedError` says which folder to pass instead.
    """
    try:
        return StoreReader(TraceStore(path, read_only=True), tier_config_id=tier_config_id,
                           instance=instance, engine=engine)
    except StoreLockedError as locked:
        segments = segments_of(path)
        if segments is None:
            raise StoreLockedError(locked.path, locked.pid,
                                   "pass its Parquet segments instead (--trace DIR, the folder "
                                   "it exports to with --segments), or stop it") from None
        holder = f"process {locked.pid}" if locked.pid else "another process"
        return SegmentReader(segments, tier_config_id=tier_config_id, instance=instance,
                             engine=engine, note=f"{path} is held by {holder} (a running collector); reading "
                                  f"its Parquet segments in {segments} instead (up to their last "
                                  "export)")
