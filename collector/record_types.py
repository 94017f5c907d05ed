"""The registry of record types: which schema dataclass is stored in which table.

One entry per record type of ``collector/events.py``. The columnar layouts
(``collector/columns.py``), the DDL (``collector/ddl.py``), the batch (``collector/batch.py``:
one Arrow table per entry, an attribute named as the table), the store's ingest, pruning and
migration, and the Parquet segments all read this tuple, so a new record type is one entry
here plus its dataclass. Standard library only: an engine process may import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.collector.events import (
    NON_NEGATIVE_BLOCK_FIELDS,
    NON_NEGATIVE_REQUEST_FIELDS,
    NON_NEGATIVE_STEP_FIELDS,
    BlockEvent,
    MetricInterval,
    RequestRecord,
    StepRecord,
)
from kvtier.collector.moves import NON_NEGATIVE_MOVE_FIELDS, TierMove


@dataclass(frozen=True, slots=True)
class RecordTable:
    """Where one record type lives.

    ``table`` names the DuckDB table, the Parquet segment folder and the ``EventBatch``
    attribute; ``time_column`` is the field retention prunes by and segments partition by
    (its UTC day); ``non_negative`` lists the fields the store refuses below zero (or NaN);
    ``added_later`` says a store written before this type existed lacks the table, which a
    writer then adds empty.
    """

    record_type: type
    table: str
    time_column: str
    non_negative: tuple[str, ...] = ()
    added_later: bool = False


RECORD_TABLES: tuple[RecordTable, ...] = (
    RecordTable(BlockEvent, "block_events", "time_s", NON_NEGATIVE_BLOCK_FIELDS),
    RecordTable(RequestRecord, "requests", "arrival_s", NON_NEGATIVE_REQUEST_FIELDS),
    RecordTable(MetricInterval, "metric_intervals", "end_s", (), added_later=True),
    RecordTable(StepRecord, "step_records", "time_s", NON_NEGATIVE_STEP_FIELDS, added_later=True),
    RecordTable(TierMove, "tier_moves", "time_s", NON_NEGATIVE_MOVE_FIELDS, added_later=True),
)
TABLE_NAMES: tuple[str, ...] = tuple(entry.table for entry in RECORD_TABLES)
_BY_TYPE = {entry.record_type: entry for entry in RECORD_TABLES}


def record_table(record_type: type) -> RecordTable:
    """The registry entry of ``record_type``; ``ValueError`` naming the known types otherwise."""
    entry = _BY_TYPE.get(record_type)
    if entry is None:
        known = ", ".join(t.__name__ for t in _BY_TYPE)
        raise ValueError(f"{getattr(record_type, '__name__', record_type)!r} is not a stored "
                         f"record type; known: {known}")
    return entry
