"""The unit of ingest: a batch of records from one source, with a sequence number.

A batch is idempotent by ``(origin.source, sequence)``: the store keeps a ledger of the
pairs it has committed and skips a batch it has seen, so a tap may replay freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import pyarrow as pa

from kvtier.collector.columns import Rejections, columns_table, empty_table, rows_to_table
from kvtier.collector.events import BlockEvent, MetricInterval, Origin, RequestRecord
from kvtier.collector.record_types import RECORD_TABLES, TABLE_NAMES


@dataclass(frozen=True)
class EventBatch:
    """Records from one origin, already validated: one Arrow table per record type of the
    registry (``collector/record_types.py``), each attribute named as its store table.

    ``rejected`` counts rows that were left out before the batch reached the store (by the
    recorder or by :meth:`from_rows`), so the store's ledger can account for them.
    ``metric_intervals`` (a scraper's), ``step_records`` (an engine scheduler's) and
    ``tier_moves`` (a guardrail's or an engine connector's) are empty unless given.
    """

    origin: Origin
    sequence: int
    block_events: pa.Table
    requests: pa.Table
    rejected: Rejections = field(default_factory=Rejections)
    metric_intervals: pa.Table | None = None
    step_records: pa.Table | None = None
    tier_moves: pa.Table | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sequence, int) or not 0 <= self.sequence < 2**63:
            raise ValueError(f"sequence must be a non-negative int below 2**63, got {self.sequence!r}")
        for entry in RECORD_TABLES:
            if getattr(self, entry.table) is None:
                object.__setattr__(self, entry.table, empty_table(entry.record_type))

    def tables(self) -> dict[str, pa.Table]:
        """Every table of the batch by store table name, in the registry's order."""
        return {name: getattr(self, name) for name in TABLE_NAMES}

    @property
    def num_rows(self) -> int:
        return sum(table.num_rows for table in self.tables().values())

    @classmethod
    def from_rows(cls, origin: Origin, sequence: int, block_events: Iterable = (),
                  requests: Iterable = ()) -> "EventBatch":
        """Build a batch from ``BlockEvent``/``RequestRecord`` values or dicts of their fields.

        Malformed rows (wrong types, out-of-range values, unknown tiers) are left out and
        counted in ``rejected``; the rest are kept.
        """
        events, rejected = rows_to_table(BlockEvent, block_events)
        reqs, more = rows_to_table(RequestRecord, requests)
        rejected.update(more)
        return cls(origin, sequence, events, reqs, rejected)

    @classmethod
    def from_columns(cls, origin: Origin, sequence: int, block_events: dict,
                     nulls: dict | None = None, rejected: Rejections | None = None) -> "EventBatch":
        """Build a batch of block events from whole numpy columns (no Python object per row;
        see :func:`kvtier.collector.columns.columns_table`). ``rejected`` counts rows the producer
        already left out; rows the schema refuses here are added to it."""
        events, more = columns_table(BlockEvent, block_events, nulls)
        counted = Rejections(rejected or {})
        counted.update(more)
        return cls(origin, sequence, events, empty_table(RequestRecord), counted)

    @classmethod
    def from_intervals(cls, origin: Origin, sequence: int, intervals: Iterable,
                       rejected: Rejections | None = None) -> "EventBatch":
        """A batch of ``MetricInterval`` values (or dicts of their fields); malformed ones are
        left out and counted, as in :meth:`from_rows`, beside ``rejected`` (what the producer
        already left out: a scraped page's series with bad values)."""
        table, more = rows_to_table(MetricInterval, intervals)
        counted = Rejections(rejected or {})
        counted.update(more)
        return cls(origin, sequence, empty_table(BlockEvent), empty_table(RequestRecord), counted,
                   table)

    @classmethod
    def joined(cls, batches: "Sequence[EventBatch]") -> "EventBatch":
        """Several stored batches of one origin read as one, for whoever folds stored batches
        in (the metrics, the live curves): each table's rows in the batches' order, the
        rejections summed, the first batch's sequence. Never stored: the ledger knows the
        batches, not this."""
        first = batches[0]
        if len(batches) == 1:
            return first
        if any(b.origin != first.origin for b in batches):
            raise ValueError("only batches of one origin are joined")
        rejected = Rejections()
        for batch in batches:
            rejected.update(batch.rejected)
        tables = {name: pa.concat_tables([b.tables()[name] for b in batches],
                                         promote_options="permissive") for name in TABLE_NAMES}
        return cls(first.origin, first.sequence, rejected=rejected, **tables)

    @classmethod
    def empty(cls, origin: Origin, sequence: int) -> "EventBatch":
        return cls(origin, sequence, empty_table(BlockEvent), empty_table(RequestRecord))
