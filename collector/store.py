"""The trace store: one DuckDB file, written by one process.

Ingest is columnar (Arrow tables registered with DuckDB and inserted with one
``INSERT ... SELECT``; never ``executemany``) and idempotent: each batch is committed in one
transaction together with its ``(source, sequence)`` ledger row, so a batch the store has
acknowledged survives a crash and a replayed batch is skipped.

DuckDB locks the file against every other process, readers included. Other processes read
the Parquet segments this store exports (``collector/segments.py``); a process that opens the
file itself to read it does so ``read_only`` (:mod:`kvtier.collector.storefile`), which never changes
a byte of it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import duckdb
import numpy as np
import pyarrow as pa

from kvtier.collector.batch import EventBatch
from kvtier.collector.columns import Rejections
from kvtier.collector.ddl import (
    LEDGER_TABLE,
    TABLE_COLUMNS,
    TIME_COLUMN,
    create_view,
    schema_statements,
)
from kvtier.collector.storefile import StoreDamagedError, check_schema, connect, damaged

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What one ``ingest`` call did. ``duplicate`` means the batch was already stored."""

    source: str
    sequence: int
    block_events: int = 0
    requests: int = 0
    rejected: Rejections = field(default_factory=Rejections)
    duplicate: bool = False
    batch_id: int | None = None
    metric_intervals: int = 0
    step_records: int = 0

    @property
    def stored(self) -> int:
        return self.block_events + self.requests + self.metric_intervals + self.step_records


@dataclass(frozen=True, slots=True)
class PruneResult:
    cutoff_s: float
    block_events: int
    requests: int
    metric_intervals: int = 0
    step_records: int = 0
    tier_moves: int = 0


@contextlib.contextmanager
def _registered(con, name: str, table: pa.Table):
    """``table`` readable as ``name`` inside the block. When the block fails, the failure is
    what propagates: unregistering inside a transaction DuckDB has aborted raises an error of
    its own ("transaction is aborted"), which would hide the cause (a damaged store)."""
    con.register(name, table)
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.unregister(name)
        raise
    con.unregister(name)


class TraceStore:
    """A DuckDB trace store. Thread-safe: calls are serialised on one connection.

    ``path`` is a file or ``":memory:"``. A writer creates a new file with its schema, brings
    an older kvtier store up to date (``migrate``) and refuses any other file; ``read_only``
    opens an existing store without changing it (see :mod:`kvtier.collector.storefile` for the
    errors). ``clock`` gives the current Unix time in seconds (injected for tests).
    """

    def __init__(self, path: str | Path = ":memory:", *, clock: Callable[[], float] = time.time,
                 read_only: bool = False, migrate: bool = True):
        self.path = str(path)
        self.read_only = read_only
        self._clock = clock
        self._lock = threading.Lock()
        self._broken = False  # DuckDB invalidated the connection: reopen before the next call
        self.damage: StoreDamagedError | None = None  # the first damage a query met
        if self.path == ":memory:":
            self._con = duckdb.connect(self.path)
        else:
            if not read_only:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._con = connect(self.path, read_only=read_only, migrate=migrate)
        # a current store is opened as it is: a writer that only reads leaves the file as it was
        if not read_only and not check_schema(self._con).current:
            for statement in schema_statements():
                self._con.execute(statement)
            self._add_missing_columns()
        self.rejected_total: Counter = Counter()

    def _add_missing_columns(self) -> None:
        """An older store's tables lack columns added to the schema since (all nullable)."""
        have = {(t, c) for t, c in self._con.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'main'").fetchall()}
        added = False
        for table, columns in TABLE_COLUMNS.items():
            for column in columns:
                if (table, column.name) not in have:
                    self._con.execute(f"ALTER TABLE {table} ADD COLUMN {column.name} {column.sql_type}")
                    added = True
        if added:  # the *_with_origin views select t.*: rebuild them over the new columns
            for table in TABLE_COLUMNS:
                self._con.execute(create_view(table))

    # ------------------------------------------------------------------ writing

    def ingest(self, batch: EventBatch) -> IngestResult:
        """Store a batch atomically, once. Returns after the commit (the acknowledgement)."""
        return self.ingest_many([batch])[0]

    def ingest_many(self, batches: Sequence[EventBatch]) -> list[IngestResult]:
        """Store several batches in one transaction (a group commit), each once: all of them
        or none. Returns after the commit, one result per batch in order. One commit for many
        small batches is what keeps a busy collector fast: a commit writes the transaction to
        DuckDB's log, while a transaction of a whole row group or more is written straight
        into the file."""
        self._writable()
        with self._connection() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                results = self._ingest_in_transaction(con, batches)
                con.execute("COMMIT")
            except BaseException:
                self._roll_back(con)
                raise
        for batch, result in zip(batches, results):
            if not result.duplicate:
                self.rejected_total.update(batch.rejected)
        return results

    def _ingest_in_transaction(self, con, batches: Sequence[EventBatch]) -> list[IngestResult]:
        """The group's ledger read once, its batch ids drawn at once, its ledger rows written
        at once: a few statements a group, not a few a batch."""
        keys = pa.table({"source": [b.origin.source for b in batches],
                         "sequence": pa.array([b.sequence for b in batches], pa.uint64())})
        with _registered(con, "_group", keys):
            seen = {(source, sequence) for source, sequence in con.execute(
                f"SELECT source, sequence FROM {LEDGER_TABLE} JOIN _group USING (source, sequence)"
            ).fetchall()}
        fresh = []  # the positions of the batches not stored before (nor earlier in the group)
        for at, batch in enumerate(batches):
            key = (batch.origin.source, batch.sequence)
            if key not in seen:
                seen.add(key)
                fresh.append(at)
        new = [batches[at] for at in fresh]
        ids = sorted(row[0] for row in con.execute(
            "SELECT nextval('batch_ids') FROM range(?)", [len(new)]).fetchall()) if new else []
        stored = dict(zip(fresh, ids))
        for table in TABLE_COLUMNS:  # each table's rows of the whole group in one insert
            self._insert_parts(table, [(batch.tables()[table], batch_id)
                                       for batch, batch_id in zip(new, ids)
                                       if batch.tables()[table].num_rows])
        if new:
            ledger = self._ledger_rows(new, ids)
            columns = ", ".join(ledger.column_names)
            with _registered(con, "_ledger", ledger):
                con.execute(f"INSERT INTO {LEDGER_TABLE} ({columns}) SELECT {columns} FROM _ledger")
        return [IngestResult(b.origin.source, b.sequence, b.block_events.num_rows,
                             b.requests.num_rows, b.rejected, False, stored[at],
                             b.metric_intervals.num_rows, b.step_records.num_rows)
                if at in stored else IngestResult(b.origin.source, b.sequence, duplicate=True)
                for at, b in enumerate(batches)]

    def _ledger_rows(self, batches: Sequence[EventBatch], ids: list[int]) -> pa.Table:
        """The ledger's rows for ``batches``, stored under ``ids``."""
        column = pa.array
        return pa.table({
            "source": column([b.origin.source for b in batches], pa.string()),
            "sequence": column([b.sequence for b in batches], pa.uint64()),
            "batch_id": column(ids, pa.int64()),
            "engine": column([b.origin.engine for b in batches], pa.string()),
            "instance": column([b.origin.instance for b in batches], pa.string()),
            "block_events": column([b.block_events.num_rows for b in batches], pa.int64()),
            "requests": column([b.requests.num_rows for b in batches], pa.int64()),
            "rejected": column([sum(b.rejected.values()) for b in batches], pa.int64()),
            "ingested_at_s": column([self._clock()] * len(batches), pa.float64())})

    @staticmethod
    def _roll_back(con) -> None:
        """Roll back a failed ingest; the original error is what the caller sees."""
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:  # a failed COMMIT rolled back already, or the database is lost
            pass

    @contextlib.contextmanager
    def _connection(self):
        """The connection, with the store's lock held. After a fatal error DuckDB refuses
        every call on it ("must be restarted": e.g. a checkpoint into a full disk), so the
        next call opens the file again first, which replays its WAL. A query that meets a
        block the file cannot give raises :class:`StoreDamagedError`."""
        with self._lock:
            if self._broken:
                try:
                    self._con.close()
                except duckdb.Error:
                    pass
                self._con = connect(self.path, read_only=self.read_only)
                self._broken = False
                log.warning("store %s: opened again after DuckDB invalidated it", self.path)
            try:
                yield self._con
            except duckdb.FatalException:
                self._broken = True
                raise
            except duckdb.Error as error:  # a block the file cannot give: say the store is damaged
                damage = damaged(self.path, error)
                if damage is None:
                    raise
                self.damage = self.damage or damage
                raise damage from error

    def _insert_parts(self, table: str, parts: list[tuple[pa.Table, int]]) -> None:
        """Insert each ``(rows, batch_id)`` of ``parts`` into ``table`` with one statement."""
        if not parts:
            return
        names = [c.name for c in TABLE_COLUMNS[table]]
        for data, _ in parts:
            if data.column_names != names:
                raise ValueError(f"{table} batch columns {data.column_names} differ from the "
                                 f"schema's {names}")
        # one contiguous table: DuckDB scans one large Arrow chunk faster than many small ones
        data = parts[0][0] if len(parts) == 1 else pa.concat_tables(
            [data for data, _ in parts], promote_options="permissive").combine_chunks()
        ids = np.repeat(np.array([batch_id for _, batch_id in parts], dtype=np.int64),
                        [part.num_rows for part, _ in parts])
        columns = ", ".join(names)
        with _registered(self._con, "_incoming", data.append_column("batch_id", pa.array(ids))):
            self._con.execute(f"INSERT INTO {table} ({columns}, batch_id) "
                              f"SELECT {columns}, batch_id FROM _incoming")

    def prune(self, max_age_s: float) -> PruneResult:
        """Retention: delete records older than ``max_age_s`` (by event time / arrival).

        The batch ledger is kept, so a replay of an old batch is still recognised and not
        stored again.
        """
        if not max_age_s >= 0:
            raise ValueError(f"max_age_s must be >= 0, got {max_age_s!r}")
        self._writable()
        cutoff = self._clock() - max_age_s
        deleted = {}
        with self._connection() as con:
            for table in TIME_COLUMN:
                deleted[table] = con.execute(
                    f"DELETE FROM {table} WHERE {TIME_COLUMN[table]} < ?", [cutoff]
                ).fetchall()[0][0]
        return PruneResult(cutoff, **deleted)

    def count_older(self, max_age_s: float) -> PruneResult:
        """What :meth:`prune` would delete now, without deleting (works read-only)."""
        if not max_age_s >= 0:
            raise ValueError(f"max_age_s must be >= 0, got {max_age_s!r}")
        cutoff = self._clock() - max_age_s
        counts = [self.scalar(f"SELECT count(*) FROM {table} WHERE {TIME_COLUMN[table]} < ?", [cutoff])
                  for table in TIME_COLUMN]
        return PruneResult(cutoff, *counts)

    def _writable(self) -> None:
        if self.read_only:
            raise PermissionError(f"the store {self.path} is open read-only")

    # ------------------------------------------------------------------ reading

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        """Run a read query on the store's connection and return an Arrow table."""
        with self._connection() as con:
            return con.sql(sql, params=params or None).to_arrow_table()

    def scalar(self, sql: str, params: list | None = None):
        with self._connection() as con:
            rows = con.execute(sql, params or []).fetchall()
        return rows[0][0] if rows else None

    def count(self, table: str) -> int:
        if table not in TABLE_COLUMNS and table != LEDGER_TABLE:
            raise ValueError(f"unknown table {table!r}; tables: {sorted([*TABLE_COLUMNS, LEDGER_TABLE])}")
        return self.scalar(f"SELECT count(*) FROM {table}")

    def next_sequence(self, source: str) -> int | None:
        """One past the highest batch sequence stored from ``source``; ``None`` if none is."""
        last = self.scalar(f"SELECT max(sequence) FROM {LEDGER_TABLE} WHERE source = ?", [source])
        return None if last is None else int(last) + 1

    def latest_source(self, prefix: str) -> tuple[str, int] | None:
        """The source whose name starts with ``prefix`` that stored a batch last, and the
        highest sequence stored from it; ``None`` if no source does (a tap resuming a stream
        after the collector restarted)."""
        with self._connection() as con:
            row = con.execute(
                f"SELECT source, max(sequence) FROM {LEDGER_TABLE} WHERE starts_with(source, ?) "
                "GROUP BY source ORDER BY max(ingested_at_s) DESC, max(batch_id) DESC LIMIT 1",
                [prefix]).fetchone()
        return None if row is None else (row[0], int(row[1]))

    def run_locked(self, work: Callable[[duckdb.DuckDBPyConnection], object]):
        """Run ``work(connection)`` with the store's lock held (for exports and readers)."""
        with self._connection() as con:
            return work(con)

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def __enter__(self) -> "TraceStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
