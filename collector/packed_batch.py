"""One drain of a recorder, still packed: what an engine process ships to the collector.

:meth:`kvtier.collector.recorder.Recorder.take_packed` returns it without any Arrow work (an engine
process has no pyarrow); :meth:`PackedBatch.to_event_batch` turns it into the validated
:class:`kvtier.collector.batch.EventBatch` the store ingests, in the collector's process (or in the
same process, for an in-process flusher). The records' ``request_key`` indexes
``request_names``; the names are per batch, so a batch decodes on its own. Step records and
tier moves travel as tuples in the schema's field order (:data:`STEP_FIELDS`,
:data:`MOVE_FIELDS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import Origin, RequestRecord, StepRecord, schema_fields
from kvtier.collector.moves import TierMove
from kvtier.collector.record_layout import DTYPE, NULL_BIT, RECORD_BYTES

REJECTED_CALL_REASON = "wrong type in record() call"
STEP_FIELDS = tuple(f.name for f in schema_fields(StepRecord))
MOVE_FIELDS = tuple(f.name for f in schema_fields(TierMove))


@dataclass(frozen=True)
class PackedBatch:
    """Block events as packed records, request records, the calls the recorder rejected,
    and step records.

    ``requests`` are ``RequestRecord`` values, or mappings of their fields once they have
    crossed a process boundary (validated when converted, like any other rows). ``steps``
    are sequences of a ``StepRecord``'s values in :data:`STEP_FIELDS` order (validated when
    converted too).
    """

    origin: Origin
    records: bytes
    request_names: tuple[str, ...]
    requests: tuple[RequestRecord | Mapping, ...] = ()
    rejected_calls: int = 0
    steps: tuple[tuple | list, ...] = ()
    moves: tuple[tuple | list, ...] = ()
    guardrail_rejected: tuple[tuple[str, int], ...] = ()  # cumulative, by reason

    def __post_init__(self) -> None:
        if len(self.records) % RECORD_BYTES:
            raise ValueError(f"records must be a multiple of {RECORD_BYTES} bytes, "
                             f"got {len(self.records)}")
        if self.rejected_calls < 0:
            raise ValueError(f"rejected_calls must be >= 0, got {self.rejected_calls}")

    @property
    def num_events(self) -> int:
        return len(self.records) // RECORD_BYTES

    def to_event_batch(self, sequence: int):
        """The validated ``EventBatch`` (imports pyarrow: call it in the collector)."""
        from kvtier.collector.batch import EventBatch
        from kvtier.collector.columns import rows_to_table

        events, rejections = decode_records(self.records, self.request_names)
        rejections.add(REJECTED_CALL_REASON, self.rejected_calls)
        requests, more = rows_to_table(RequestRecord, self.requests)
        rejections.update(more)
        steps, more = rows_to_table(StepRecord, (_fields(row, STEP_FIELDS) for row in self.steps))
        rejections.update(more)
        moves, more = rows_to_table(TierMove, (_fields(row, MOVE_FIELDS) for row in self.moves))
        rejections.update(more)
        return EventBatch(self.origin, sequence, events, requests, rejections, step_records=steps,
                          tier_moves=moves)


def _fields(row, names: tuple[str, ...]) -> dict | None:
    if isinstance(row, (tuple, list)) and len(row) == len(names):
        return dict(zip(names, row))
    return None  # counted as "row is not a record or mapping"


def decode_records(data: bytes, request_names):
    """Packed records -> (validated block-event table, rejections). A record whose request key
    names no entry of ``request_names`` or whose enum code is unknown is left out, counted."""
    import pyarrow as pa

    from kvtier.collector.columns import (
        BLOCK_EVENT_COLUMNS,
        Rejections,
        enum_array,
        unknown_codes,
        validate_table,
    )
    from kvtier.collector.events import BlockEvent

    packed = np.frombuffer(data, dtype=DTYPE)
    nulls = packed["nulls"]
    rejections = Rejections()
    keep = np.ones(len(packed), dtype=bool)
    arrays = {}
    for column in BLOCK_EVENT_COLUMNS:
        name = column.name
        null = (nulls & NULL_BIT[name]) != 0 if name in NULL_BIT else None
        if name == "request_id":
            keys = packed["request_key"].astype(np.int64)
            unnamed = ~null & (keys >= len(request_names))
            if unnamed.any():
                rejections.add("request key without a name", int(unnamed.sum()), int(keys[unnamed][0]))
                keep &= ~unnamed
            indices = pa.array(np.where(null | unnamed, 0, keys).astype(np.int32), mask=null | unnamed)
            names = pa.array(list(request_names) or [""], type=pa.string())
            arrays[name] = pa.DictionaryArray.from_arrays(indices, names).cast(pa.string())
            continue
        values = np.ascontiguousarray(packed[name])
        if column.enum_type is not None:
            bad = unknown_codes(column, values, null)
            if bad.any():
                rejections.add(f"unknown {column.sql_type} code in {name}", int(bad.sum()),
                               int(values[bad][0]))
                keep &= ~bad
                values = np.where(bad, 0, values).astype(np.int8)
            arrays[name] = enum_array(column, values, null)
        else:
            arrays[name] = pa.array(values, type=column.arrow_type, mask=null)
    table = pa.table(arrays)
    if not keep.all():
        table = table.filter(pa.array(keep))
    table, more = validate_table(BlockEvent, table)
    rejections.update(more)
    return table, rejections
