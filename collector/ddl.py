"""DuckDB DDL derived from the schema (``collector/events.py`` via ``collector/columns.py``).

Every stored row carries the store's ``batch_id``; where the batch came from (engine,
instance, source, sequence) is kept once per batch in the ledger, not once per row, which
halves the bytes a commit writes. The ``*_with_origin`` views join the two back.
"""

from __future__ import annotations

from kvtier.collector.columns import ENUM_SQL_NAMES, Column, columns_of
from kvtier.collector.events import BlockEvent, MetricInterval, RequestRecord, StepRecord
from kvtier.collector.moves import TierMove
from kvtier.collector.record_types import RECORD_TABLES, record_table

BLOCK_EVENTS_TABLE = record_table(BlockEvent).table
REQUESTS_TABLE = record_table(RequestRecord).table
METRIC_INTERVALS_TABLE = record_table(MetricInterval).table
STEP_RECORDS_TABLE = record_table(StepRecord).table
TIER_MOVES_TABLE = record_table(TierMove).table
LEDGER_TABLE = "ingested_batches"
EXPORTS_TABLE = "segment_exports"

ORIGIN_COLUMNS = ("engine", "instance", "source", "sequence")
# One entry per record type of the registry (collector/record_types.py), in its order.
TABLE_COLUMNS: dict[str, tuple[Column, ...]] = {
    entry.table: columns_of(entry.record_type) for entry in RECORD_TABLES}
WITH_ORIGIN = {entry.table: f"{entry.table}_with_origin" for entry in RECORD_TABLES}
TIME_COLUMN = {entry.table: entry.time_column for entry in RECORD_TABLES}


def enum_types() -> list[str]:
    statements = []
    for kind, sql_name in ENUM_SQL_NAMES.items():
        labels = ", ".join(f"'{m.name.lower()}'" for m in kind)
        statements.append(f"CREATE TYPE IF NOT EXISTS {sql_name} AS ENUM ({labels})")
    return statements


def create_table(table: str) -> str:
    parts = [f"{c.name} {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in TABLE_COLUMNS[table]]
    parts.append("batch_id BIGINT NOT NULL")
    return f"CREATE TABLE IF NOT EXISTS {table} (\n  " + ",\n  ".join(parts) + "\n)"


def create_view(table: str) -> str:
    origin = ", ".join(f"b.{name}" for name in ORIGIN_COLUMNS)
    return (f"CREATE OR REPLACE VIEW {WITH_ORIGIN[table]} AS SELECT t.*, {origin} "
            f"FROM {table} t JOIN {LEDGER_TABLE} b USING (batch_id)")


def schema_statements() -> list[str]:
    """Everything a new store runs, in order. Idempotent."""
    return [
        *enum_types(),
        "CREATE SEQUENCE IF NOT EXISTS batch_ids START 1",
        *(create_table(table) for table in TABLE_COLUMNS),
        f"""CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (
  source VARCHAR NOT NULL, sequence UBIGINT NOT NULL, batch_id BIGINT NOT NULL,
  engine VARCHAR NOT NULL, instance VARCHAR NOT NULL,
  block_events BIGINT NOT NULL, requests BIGINT NOT NULL, rejected BIGINT NOT NULL,
  ingested_at_s DOUBLE NOT NULL,
  PRIMARY KEY (source, sequence))""",
        f"""CREATE TABLE IF NOT EXISTS {EXPORTS_TABLE} (
  segment_root VARCHAR NOT NULL, table_name VARCHAR NOT NULL, through_batch_id BIGINT NOT NULL, files INTEGER NOT NULL,
  rows BIGINT NOT NULL, exported_at_s DOUBLE NOT NULL)""",
        *(create_view(table) for table in TABLE_COLUMNS),
    ]
