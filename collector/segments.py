"""Immutable Parquet segments: how other processes read what the store holds.

DuckDB's writer locks its file against every other process, so the dashboard, ``analyze``
and fleet-wide queries read segments instead. ``export_segments`` writes the rows of every
batch committed since the last export as new files under a hive layout::

    ROOT/block_events/day=2026-11-29/instance=node-7/b000042-<uuid>.parquet
    ROOT/requests/day=2026-11-29/instance=node-7/b000042-<uuid>.parquet
    ROOT/step_records/day=2026-11-29/instance=node-7/b000042-<uuid>.parquet

(one folder per table of ``collector/record_types.py``'s registry).

Files are written in a staging folder and renamed into place, so a reader never sees a
partial file; a written file is never changed again. ``day`` is the UTC date of the table's
time column (``time_s``, ``arrival_s``, ``end_s``).

A running collector writes :func:`segments_note` next to its store, so a reader that finds
the store locked can read the segments that collector exports instead (:func:`segments_of`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from kvtier.collector import json_text
from kvtier.collector.ddl import EXPORTS_TABLE, REQUESTS_TABLE, TIME_COLUMN, WITH_ORIGIN
from kvtier.collector.record_types import TABLE_NAMES
from kvtier.collector.store import TraceStore

SEGMENT_TABLES = TABLE_NAMES  # every record table: block events, requests, metric intervals, steps


@dataclass(frozen=True, slots=True)
class ExportResult:
    files: tuple[Path, ...]
    rows: dict[str, int]

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


def export_segments(store: TraceStore, root: str | Path) -> ExportResult:
    """Write the rows of batches committed since the previous export to ``root`` as new
    segments (the store remembers, per root, how far it has exported)."""
    root = Path(root).resolve()
    staging = root / f".staging-{uuid.uuid4().hex}"
    files: list[Path] = []
    rows: dict[str, int] = {}

    def work(con) -> None:
        # One transaction: the ledger rows commit only after every file is in place, and a
        # failure (a full disk, a read-only folder) leaves the store as it was.
        through = con.execute("SELECT coalesce(max(batch_id), 0) FROM ingested_batches").fetchall()[0][0]
        con.execute("BEGIN TRANSACTION")
        try:
            staged = []
            for table in SEGMENT_TABLES:
                done = con.execute(
                    f"SELECT coalesce(max(through_batch_id), 0) FROM {EXPORTS_TABLE} "
                    "WHERE segment_root = ? AND table_name = ?", [str(root), table]).fetchall()[0][0]
                count = con.execute(
                    f"SELECT count(*) FROM {table} WHERE batch_id > ? AND batch_id <= ?", [done, through]
                ).fetchall()[0][0]
                rows[table] = count
                if count:
                    _write_table(con, table, done, through, staging / table)
                staged.append((table, count))
            for table, count in staged:
                written = _move(staging / table, root / table) if count else []
                files.extend(written)
                con.execute(f"INSERT INTO {EXPORTS_TABLE} VALUES (?, ?, ?, ?, ?, epoch(now()))",
                            [str(root), table, through, len(written), count])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    try:
        store.run_locked(work)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(tuple(files), rows)


def _write_table(con, table: str, after: int, through: int, staging: Path) -> None:
    staging.mkdir(parents=True, exist_ok=True)
    day = f"strftime(make_timestamp(CAST({TIME_COLUMN[table]} * 1e6 AS BIGINT)), '%Y-%m-%d')"
    con.execute(f"""
        COPY (SELECT *, {day} AS day FROM {WITH_ORIGIN[table]}
              WHERE batch_id > {int(after)} AND batch_id <= {int(through)}
              ORDER BY {TIME_COLUMN[table]})
        TO '{_sql_path(staging)}'
        (FORMAT parquet, PARTITION_BY (day, instance), FILENAME_PATTERN 'b{int(through):07d}-{{uuid}}',
         COMPRESSION zstd)""")


def _move(staging: Path, final: Path) -> list[Path]:
    moved = []
    for path in sorted(staging.rglob("*.parquet")):
        target = final / path.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)  # atomic within one filesystem
        moved.append(target)
    return moved


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


def segment_glob(root: str | Path, table: str) -> str:
    """The glob DuckDB (or any Parquet engine) reads a table's segments with."""
    if table not in SEGMENT_TABLES:
        raise ValueError(f"unknown segment table {table!r}; tables: {', '.join(SEGMENT_TABLES)}")
    return str(Path(root) / table / "**" / "*.parquet")


def has_segments(root: str | Path, table: str) -> bool:
    return any((Path(root) / table).rglob("*.parquet"))


def segments_relation(root: str | Path, table: str) -> str:
    """SQL text for a table's segments, for use in FROM (hive columns ``day``, ``instance``)."""
    return (f"read_parquet('{_sql_path(Path(segment_glob(root, table)))}', "
            "hive_partitioning = true, union_by_name = true)")


def segment_instances(root: str | Path) -> tuple[str, ...]:
    """The serving instances whose requests the segments under ``root`` hold, sorted."""
    if not has_segments(root, REQUESTS_TABLE):
        return ()
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # on stdout: maybe a --json answer
    try:
        rows = con.sql(f"SELECT DISTINCT instance FROM {segments_relation(root, REQUESTS_TABLE)} "
                       "WHERE instance IS NOT NULL ORDER BY instance").fetchall()
    finally:
        con.close()
    return tuple(str(r[0]) for r in rows)


# ---------------------------------------------------------------------- a running collector's note

def note_path(store_path: str | Path) -> Path:
    store_path = Path(store_path)
    return store_path.with_name(store_path.name + ".segments.json")


def segments_note(store_path: str | Path, segments_dir: str | Path) -> Path:
    """Say next to the store where its writer exports segments (removed by :func:`clear_note`)."""
    path = note_path(store_path)
    return json_text.write(path, {"segments": str(Path(segments_dir).resolve()), "pid": os.getpid()},
                           indent=None)


def clear_note(store_path: str | Path) -> None:
    try:
        note_path(store_path).unlink()
    except FileNotFoundError:
        pass


def segments_of(store_path: str | Path) -> Path | None:
    """The Parquet segment folder the store's writer exports to, if it is known and holds
    segments: from the writer's note, else a ``segments`` folder beside the store."""
    store_path = Path(store_path)
    candidates = []
    try:
        candidates.append(Path(json.loads(note_path(store_path).read_text())["segments"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    candidates.append(store_path.parent / "segments")
    for folder in candidates:
        if folder.is_dir() and has_segments(folder, REQUESTS_TABLE):
            return folder
    return None
