"""Opening a store file: is it a kvtier store, of this schema, and can it be opened now?

Two ways in, both through :func:`connect`:

* read-only (``store info``, ``analyze``, ``simulate``, ``recommend``, ``evaluate``): DuckDB's
  ``read_only`` connection, so nothing is created, migrated or checkpointed and the file stays
  byte-identical; an immutable file opens too.
* writer (the collector, the reference engine, the demo): a missing or empty DuckDB file gets
  the schema; a store of an older schema gets its missing nullable columns (said in one log
  line); anything else is refused, so kvtier never adds its tables to someone else's database.

The errors say what the file is and what to do: :class:`NotAStoreError`,
:class:`StoreDamagedError` and :class:`StoreSchemaError` are bad input (``ValueError``);
:class:`StoreLockedError` is a runtime failure (``OSError``) naming the process that holds
DuckDB's lock.

A damaged store is refused at open, before a writer takes batches it could not keep: DuckDB
opens a truncated file and answers from its catalog (row counts, tables) until a query reaches
a block past the end, so :func:`connect` checks that the file holds every block its header
names. A block that fails DuckDB's checksum is found only when read; :func:`damaged` turns
that error, wherever a query meets it, into the same :class:`StoreDamagedError`.

A reader that finds the store locked can read the Parquet segments its writer exports instead
(:func:`kvtier.collector.segments.segments_of`).
"""

from __future__ import annotations

import errno
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from kvtier.collector.ddl import EXPORTS_TABLE, LEDGER_TABLE, TABLE_COLUMNS
from kvtier.collector.record_types import RECORD_TABLES

log = logging.getLogger(__name__)

KVTIER_TABLES = (*TABLE_COLUMNS, LEDGER_TABLE, EXPORTS_TABLE)
# Tables an older store may lack: a writer adds them empty.
_ADDED_TABLES = {EXPORTS_TABLE} | {entry.table for entry in RECORD_TABLES if entry.added_later}


class NotAStoreError(ValueError):
    """The file is not a kvtier store (not DuckDB, empty, truncated, someone else's database)."""


class StoreDamagedError(ValueError):
    """A kvtier store whose file is damaged: cut short, or a block failing DuckDB's checksum."""

    def __init__(self, path: str | Path, detail: str):
        super().__init__(f"{path} is damaged ({detail}); restore it from a copy, or give "
                         "another path (Parquet segments it exported keep their rows)")
        self.path = Path(path)


class StoreSchemaError(ValueError):
    """A kvtier store of another schema version than this kvtier reads."""


class StoreLockedError(OSError):
    """Another process holds DuckDB's lock on the store. ``pid`` when DuckDB names it;
    ``hint`` (what the caller can do instead) ends the message."""

    def __init__(self, path: Path, pid: int | None, hint: str = "stop it or use another store"):
        holder = f"process {pid}" if pid else "another process"
        super().__init__(f"{path} is locked by {holder} (a running kvtier collect or engine?); {hint}")
        self.errno, self.path, self.pid = errno.EBUSY, Path(path), pid


@dataclass(frozen=True)
class SchemaCheck:
    """How a DuckDB file's tables compare with the store schema this kvtier writes."""

    tables: tuple[str, ...]
    missing_tables: tuple[str, ...]
    missing_columns: tuple[tuple[str, str], ...]  # (table, column)
    extra_columns: tuple[tuple[str, str], ...]

    @property
    def is_kvtier(self) -> bool:
        return any(t in self.tables for t in KVTIER_TABLES)

    @property
    def current(self) -> bool:
        return not (self.missing_tables or self.missing_columns or self.extra_columns)

    @property
    def migratable(self) -> bool:
        """Only nullable columns (or tables added since, still empty) missing: an older store
        a writer can bring up to date without touching a row."""
        nullable = {(t, c.name) for t, cols in TABLE_COLUMNS.items() for c in cols if c.nullable}
        return (self.is_kvtier and not self.extra_columns
                and set(self.missing_tables) <= _ADDED_TABLES
                and all(col in nullable for col in self.missing_columns))


def check_schema(con) -> SchemaCheck:
    """Compare the connection's main-schema tables and columns with the DDL's."""
    rows = con.execute("SELECT table_name, column_name FROM information_schema.columns "
                       "WHERE table_schema = 'main' AND table_catalog = current_database()").fetchall()
    found: dict[str, set[str]] = {}
    for table, column in rows:
        found.setdefault(table, set()).add(column)
    expected = {t: {c.name for c in cols} | {"batch_id"} for t, cols in TABLE_COLUMNS.items()}
    missing_tables = tuple(t for t in KVTIER_TABLES if t not in found)
    missing, extra = [], []
    for table, columns in expected.items():
        if table in found:
            missing += [(table, c) for c in sorted(columns - found[table])]
            extra += [(table, c) for c in sorted(found[table] - columns)]
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    tables = tuple(sorted(set(found) - views))
    return SchemaCheck(tables, missing_tables, tuple(missing), tuple(extra))


def connect(path: str | Path, *, read_only: bool, migrate: bool = True):
    """A DuckDB connection to the store at ``path``, checked as the module says. A writer
    with ``migrate=False`` refuses an older store instead of bringing it up to date."""
    import duckdb

    path = Path(path)
    if read_only and not path.exists():
        raise FileNotFoundError(errno.ENOENT, "no such store", str(path))
    if path.is_dir():
        raise NotAStoreError(f"{path} is a folder, not a store file (a folder of Parquet "
                             "segments is read with --trace)")
    if path.exists() and path.stat().st_size == 0:
        raise NotAStoreError(f"{path} is an empty file, not a DuckDB store; remove it or give "
                             "another path")
    _check_header(path)
    try:
        con = duckdb.connect(str(path), read_only=read_only)
        # no progress bar: DuckDB draws it on stdout, which may be a --json answer
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error as error:
        raise _open_error(path, error) from None
    try:
        _check_length(path, con)
        check = check_schema(con)
        _accept(path, con, check, read_only, migrate)
    except BaseException:
        con.close()
        raise
    return con


# A DuckDB file has this magic at this offset. DuckDB itself opens other files it recognises
# (Parquet, CSV, JSON) as an empty in-memory database, so a store kept nothing and said rows.
_MAGIC, _MAGIC_AT = b"DUCK", 8
_KNOWN_HEADERS = ((b"PAR1", "a Parquet file"), (b"SQLite format 3\x00", "an SQLite database"),
                  (b"\x1f\x8b", "a gzip file"), (b"PK\x03\x04", "a zip archive"))


def _check_header(path: Path) -> None:
    """Refuse an existing file that is not DuckDB by its header, whatever its name says."""
    try:
        with open(path, "rb") as file:
            head = file.read(_MAGIC_AT + len(_MAGIC))
    except OSError:
        return  # unreadable: DuckDB's own error says why
    if head[_MAGIC_AT:] == _MAGIC:
        return
    known = next((name for magic, name in _KNOWN_HEADERS if head.startswith(magic)), None)
    what = f"is {known}, not a DuckDB store" if known else "is not a DuckDB store (no DuckDB header)"
    raise NotAStoreError(f"{path} {what}; give the DuckDB file kvtier collect or kvtier demo "
                         "wrote, or a new path for a new store")


# DuckDB's file: a main header and two database headers of 4 KiB each, then the blocks the
# active header counts (duckdb/storage/storage_info.hpp: DatabaseHeader.block_count;
# SingleFileBlockManager: BLOCK_START = FILE_HEADER_SIZE * 3). Blocks past that count are free.
_BLOCKS_START = 3 * 4096


def _check_length(path: Path, con) -> None:
    """Refuse a file shorter than the blocks in use its header names (a truncated copy or
    write). The header's total counts free blocks too, and DuckDB may cut free blocks off
    the file's end at a checkpoint (a store written, closed and reopened held 8 of the 9 blocks
    its header counted, 6 of them used): only the used ones must be there. A cut that keeps
    as many bytes as the used blocks but loses one of them is found when a query reaches it."""
    block_bytes, blocks = con.execute(
        "SELECT block_size, used_blocks FROM pragma_database_size() "
        "WHERE database_name = current_database()").fetchone()
    needed = _BLOCKS_START + block_bytes * blocks if blocks else 0
    held = path.stat().st_size
    if held < needed:
        raise StoreDamagedError(path, f"cut short: it holds {held:,} bytes of the {needed:,} "
                                "its header names")


# What DuckDB says when a query reaches a block a damaged file cannot give.
_DAMAGE = (re.compile(r"Could not read enough bytes from file .*? from location (\d+)"),
           re.compile(r"Corrupt database file: .*? in block at location (\d+)"))


def damaged(path: str | Path, error: BaseException) -> StoreDamagedError | None:
    """``error`` as a :class:`StoreDamagedError` naming ``path``, when it is DuckDB meeting a
    block the file cannot give (cut short, or failing its checksum); else ``None``."""
    text = str(error)
    for pattern, what in zip(_DAMAGE, ("cut short", "a block fails DuckDB's checksum")):
        match = pattern.search(text)
        if match:
            return StoreDamagedError(path, f"{what} at byte {int(match.group(1)):,}")
    return None


def _accept(path: Path, con, check: SchemaCheck, read_only: bool, migrate: bool) -> None:
    if check.current:
        return
    if not check.is_kvtier:
        if not check.tables and not read_only:
            return  # an empty DuckDB file: the writer gives it the schema
        held = f"it holds {', '.join(check.tables[:5])}" if check.tables else "it holds no tables"
        raise NotAStoreError(f"{path} is a DuckDB file but not a kvtier store ({held}); give "
                             "a store written by kvtier collect or kvtier demo")
    described = _describe(check)
    if not check.migratable:
        raise StoreSchemaError(f"{path} is a kvtier store of another schema ({described}); "
                               "read it with the kvtier version that wrote it")
    if read_only or not migrate:
        raise StoreSchemaError(f"{path} was written by an older kvtier ({described}); bring it "
                               f"up to date once with: kvtier store migrate {path}")
    log.warning("store %s: adding what this kvtier's schema has and the file lacks (%s)",
                path, described)


def _describe(check: SchemaCheck) -> str:
    parts = [f"no {t} table" for t in check.missing_tables]
    for word, pairs in (("lacks", check.missing_columns), ("has unknown", check.extra_columns)):
        by_table: dict[str, list[str]] = {}
        for table, column in pairs:
            by_table.setdefault(table, []).append(column)
        for table, columns in by_table.items():
            named = ", ".join(columns[:4]) + (f" and {len(columns) - 4} more" if len(columns) > 4 else "")
            parts.append(f"{table} {word} {named}")
    return "; ".join(parts)


_PID = re.compile(r"\(PID (\d+)\)")


def _open_error(path: Path, error: Exception) -> Exception:
    text = str(error)
    if "Could not set lock" in text or "Conflicting lock" in text:
        pid = _PID.search(text)
        return StoreLockedError(path, int(pid.group(1)) if pid else None)
    if "not a valid DuckDB database" in text or "Could not read enough bytes" in text:
        return NotAStoreError(f"{path} is not a DuckDB store (not a DuckDB file, or a truncated "
                              "one); give the store kvtier collect or kvtier demo wrote")
    damage = damaged(path, error)
    if damage is not None:
        return damage
    if "Operation not permitted" in text or "Permission denied" in text:
        reason = "Operation not permitted" if "Operation not permitted" in text else "Permission denied"
        return PermissionError(errno.EPERM, reason, str(path))
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return OSError(errno.EIO, f"cannot open the store {path}: {first}")
