"""Column layouts derived from the schema, and rows -> Arrow conversion with validation.

``collector/events.py`` defines the records; this module turns each dataclass field into a
:class:`Column` (SQL type, Arrow type, nullability) so the DuckDB tables, the Arrow batches
and the Parquet segments all follow the schema without restating it; which types there are is
``collector/record_types.py``'s registry.

Conversion never raises on bad rows: a row with a wrong type, a negative latency or an
unknown tier is left out and counted under a reason (``Rejections``); the rest convert.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import typing
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvtier.collector.events import (
    METRIC_KINDS,
    NEGATIVE_METRIC_VALUE,
    NON_FINITE_METRIC_SUM,
    NON_FINITE_METRIC_VALUE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    SERVED_OVER_PROMPT,
    SERVED_TOKEN_FIELDS,
    BlockEvent,
    MetricInterval,
    Outcome,
    RequestRecord,
    StepRecord,
    Tier,
    upper_bounds,
)
from kvtier.collector.record_types import RECORD_TABLES, record_table

log = logging.getLogger(__name__)

_SQL_TO_ARROW = {
    "DOUBLE": pa.float64(), "BIGINT": pa.int64(), "INTEGER": pa.int32(),
    "SMALLINT": pa.int16(), "UBIGINT": pa.uint64(), "VARCHAR": pa.string(),
    "UBIGINT[]": pa.list_(pa.uint64()),
}
_PY_TO_SQL = {float: "DOUBLE", int: "BIGINT", str: "VARCHAR"}
ENUM_SQL_NAMES = {Tier: "tier", Outcome: "outcome"}


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its name, DuckDB type, Arrow type, and for enums the enum class."""

    name: str
    sql_type: str
    arrow_type: pa.DataType
    nullable: bool
    enum_type: type[enum.IntEnum] | None = None

    @property
    def enum_labels(self) -> list[str]:
        return [m.name.lower() for m in self.enum_type] if self.enum_type else []


def _columns_of(record_type: type) -> tuple[Column, ...]:
    hints = typing.get_type_hints(record_type)
    columns = []
    for f in dataclasses.fields(record_type):
        base, nullable = _unwrap_optional(hints[f.name])
        if isinstance(base, type) and issubclass(base, enum.IntEnum):
            columns.append(Column(f.name, ENUM_SQL_NAMES[base], pa.dictionary(pa.int8(), pa.string()),
                                  nullable, base))
            continue
        sql = f.metadata.get("sql") or _PY_TO_SQL[base]
        columns.append(Column(f.name, sql, _SQL_TO_ARROW[sql], nullable))
    return tuple(columns)


def _unwrap_optional(hint) -> tuple[Any, bool]:
    args = typing.get_args(hint)
    if type(None) in args:
        (base,) = [a for a in args if a is not type(None)]
        return base, True
    return (tuple if typing.get_origin(hint) is tuple else hint), False


_COLUMNS = {entry.record_type: _columns_of(entry.record_type) for entry in RECORD_TABLES}
BLOCK_EVENT_COLUMNS: tuple[Column, ...] = _COLUMNS[BlockEvent]
REQUEST_COLUMNS: tuple[Column, ...] = _COLUMNS[RequestRecord]
METRIC_INTERVAL_COLUMNS: tuple[Column, ...] = _COLUMNS[MetricInterval]
STEP_COLUMNS: tuple[Column, ...] = _COLUMNS[StepRecord]


def columns_of(record_type: type) -> tuple[Column, ...]:
    """The columns of a record type of the registry (``collector/record_types.py``)."""
    return _COLUMNS[record_table(record_type).record_type]


class Rejections(Counter):
    """Rows left out of a batch, counted by reason (``"negative latency_s"``, ...)."""

    def add(self, reason: str, count: int = 1, example: Any = None) -> None:
        if count <= 0:
            return
        if reason not in self:
            log.warning("rejected %d row(s): %s%s", count, reason,
                        f" (e.g. {example!r})" if example is not None else "")
        self[reason] += count


# ---------------------------------------------------------------- rows -> Arrow

def rows_to_table(record_type: type, rows: Iterable[Any]) -> tuple[pa.Table, Rejections]:
    """Convert dataclass instances or dicts (keyed by field name) to a validated table.

    Enum fields accept the member, its label (``"cpu"``) or its code (``1``). Rows with a
    missing required field, a value of the wrong type, an unknown enum value or a value
    outside the schema's range are dropped and counted in the returned ``Rejections``.
    """
    columns = columns_of(record_type)
    rejections = Rejections()
    records = [_as_mapping(row) for row in rows]
    keep = np.ones(len(records), dtype=bool)
    values_by_column = {}
    for column in columns:
        values = [r.get(column.name) if r is not None else None for r in records]
        values_by_column[column.name] = _coerce(column, values, keep, rejections)
    for i, r in enumerate(records):
        if r is None and keep[i]:
            keep[i] = False
            rejections.add("row is not a record or mapping")
    arrays = {}
    for column in columns:
        values = [v for v, k in zip(values_by_column[column.name], keep) if k]
        arrays[column.name] = _to_arrow(column, values)
    table = pa.table(arrays)
    table, more = validate_table(record_type, table)
    rejections.update(more)
    return table, rejections


def _as_mapping(row: Any) -> dict | None:
    if isinstance(row, dict):
        return row
    if dataclasses.is_dataclass(row):
        return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    return None


def _coerce(column: Column, values: list, keep: np.ndarray, rejections: Rejections) -> list:
    """Per-value type check; marks bad rows in ``keep``. Returns the (possibly mapped) values."""
    check = _CHECKS[column.sql_type] if column.enum_type is None else None
    out = []
    for i, value in enumerate(values):
        if value is None:
            if not column.nullable and keep[i]:
                keep[i] = False
                rejections.add(f"missing {column.name}")
            out.append(None)
            continue
        if column.enum_type is not None:
            code = _ENUM_CODES[column.enum_type].get(value)
            if code is None:
                if keep[i]:
                    keep[i] = False
                    rejections.add(f"unknown {ENUM_SQL_NAMES[column.enum_type]}", example=value)
                out.append(None)
            else:
                out.append(code)
            continue
        if not check(value):
            if keep[i]:
                keep[i] = False
                rejections.add(f"wrong type for {column.name}", example=value)
            out.append(None)
            continue
        out.append(tuple(value) if column.sql_type == "UBIGINT[]" else value)
    return out


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _is_uint64(v) -> bool:
    return _is_int(v) and 0 <= v < 2**64


def _is_hash_list(v) -> bool:
    return isinstance(v, (tuple, list)) and all(_is_uint64(h) for h in v)


_CHECKS = {
    "DOUBLE": _is_number, "BIGINT": _is_int, "INTEGER": lambda v: _is_int(v) and -2**31 <= v < 2**31,
    "SMALLINT": lambda v: _is_int(v) and -2**15 <= v < 2**15, "UBIGINT": _is_uint64,
    "VARCHAR": lambda v: isinstance(v, str), "UBIGINT[]": _is_hash_list,
}


def _enum_codes(kind: type[enum.IntEnum]) -> dict:
    codes: dict = {}
    for member in kind:
        codes[member] = codes[member.name.lower()] = codes[int(member)] = int(member)
    return codes


_ENUM_CODES = {Tier: _enum_codes(Tier), Outcome: _enum_codes(Outcome)}


def _to_arrow(column: Column, values: list) -> pa.Array:
    if column.enum_type is not None:
        return enum_array(column, pa.array(values, type=pa.int8()))
    return pa.array(values, type=column.arrow_type)


def enum_array(column: Column, codes: pa.Array | np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
    """Dictionary-encode valid enum codes with the enum's labels (DuckDB reads it as its ENUM).

    ``mask`` marks nulls (True = null). Codes must already be in range; see ``unknown_codes``.
    """
    if not isinstance(codes, pa.Array):
        codes = pa.array(codes, type=pa.int8(), mask=mask)
    return pa.DictionaryArray.from_arrays(codes, pa.array(column.enum_labels))


def unknown_codes(column: Column, codes: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Boolean array: which raw codes name no member of the column's enum (nulls never do)."""
    bad = (codes < 0) | (codes >= len(column.enum_labels))
    return bad & ~mask if mask is not None else bad


# ---------------------------------------------------------------- arrays -> Arrow

def columns_table(record_type: type, values: dict[str, np.ndarray],
                  nulls: dict[str, np.ndarray] | None = None) -> tuple[pa.Table, Rejections]:
    """Build a validated table from whole columns, with no Python object per row.

    ``values`` maps column names to numpy arrays of one length (enum columns as their int
    codes); ``nulls`` maps names to boolean masks (True = null). Columns not given are all
    null; leaving out a required column is a ``ValueError``. Rows with an unknown enum code or
    a value outside the schema's range are dropped and counted, as in :func:`rows_to_table`.
    """
    nulls = nulls or {}
    unknown = set(values) - {c.name for c in columns_of(record_type)}
    if unknown:
        raise ValueError(f"unknown columns {sorted(unknown)}; the schema has "
                         f"{[c.name for c in columns_of(record_type)]}")
    lengths = {len(v) for v in values.values()}
    if len(lengths) > 1:
        raise ValueError(f"columns differ in length: {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    rejections = Rejections()
    arrays, bad = {}, None
    for column in columns_of(record_type):
        if column.name not in values:
            if not column.nullable:
                raise ValueError(f"required column {column.name!r} is missing")
            arrays[column.name] = pa.nulls(n, column.arrow_type)
            continue
        mask = nulls.get(column.name)
        if mask is not None and not mask.any():
            mask = None
        if mask is not None and not column.nullable:
            raise ValueError(f"column {column.name!r} cannot hold nulls")
        if column.enum_type is None:
            arrays[column.name] = pa.array(values[column.name], type=column.arrow_type, mask=mask)
            continue
        codes = values[column.name]
        wrong = unknown_codes(column, codes, mask)
        if wrong.any():
            rejections.add(f"unknown {ENUM_SQL_NAMES[column.enum_type]}", int(wrong.sum()),
                           int(codes[wrong][0]))
            bad = wrong if bad is None else bad | wrong
            codes = np.where(wrong, 0, codes)
        arrays[column.name] = enum_array(column, codes.astype(np.int8, copy=False), mask)
    table = pa.table(arrays)
    if bad is not None:
        table = table.filter(pa.array(~bad))
    table, more = validate_table(record_type, table)
    rejections.update(more)
    return table, rejections


# ---------------------------------------------------------------- vectorised checks

def validate_table(record_type: type, table: pa.Table) -> tuple[pa.Table, Rejections]:
    """Drop rows that break the schema's range rules; count them by reason."""
    rejections = Rejections()
    bad = None
    for name in record_table(record_type).non_negative:
        column = table.column(name)
        # NaN compares false, so "not (x >= 0)" also catches NaN; nulls are allowed.
        broken = pc.fill_null(pc.invert(pc.greater_equal(column, 0)), False)
        bad = _count_and_merge(bad, broken, f"negative or NaN {name}", rejections, column)
    for f in dataclasses.fields(record_type):  # a field's "choices": the values it may take
        if "choices" in f.metadata:
            column = table.column(f.name)
            unknown = pc.and_(pc.is_valid(column), pc.invert(pc.is_in(column, pa.array(f.metadata["choices"]))))
            bad = _count_and_merge(bad, unknown, f"unknown {f.name}", rejections, column)
    if record_type is MetricInterval:
        kind = table.column("kind")
        unknown = pc.invert(pc.is_in(kind, pa.array(METRIC_KINDS)))
        bad = _count_and_merge(bad, unknown, "unknown metric kind", rejections, kind)
        backwards = pc.fill_null(pc.less(table.column("end_s"), table.column("start_s")), False)
        bad = _count_and_merge(bad, backwards, "end_s before start_s", rejections, None)
        bad = _metric_values(table, bad, rejections)
    if record_type is StepRecord:
        time_s = table.column("time_s")
        infinite = pc.invert(pc.is_finite(time_s))
        bad = _count_and_merge(bad, infinite, "time_s not finite", rejections, time_s)
        orphan = pc.and_(pc.greater(table.column("prefill_tokens"), 0),
                         pc.equal(table.column("prefill_requests"), 0))
        bad = _count_and_merge(bad, orphan, "prefill_tokens over no prefill_requests", rejections, None)
        duration = table.column("duration_s")
        endless = pc.fill_null(pc.is_inf(duration), False)
        bad = _count_and_merge(bad, endless, "duration_s not finite", rejections, duration)
    if record_type is BlockEvent:
        priority = table.column("priority")
        outside = pc.fill_null(pc.or_(pc.less(priority, PRIORITY_MIN), pc.greater(priority, PRIORITY_MAX)), False)
        bad = _count_and_merge(bad, outside, f"priority outside {PRIORITY_MIN}..{PRIORITY_MAX}", rejections, priority)
    bad = _bounds_and_sums(record_type, table, bad, rejections)
    if bad is None or not pc.any(bad).as_py():
        return table, rejections
    return table.filter(pc.invert(bad)), rejections


def _metric_values(table: pa.Table, bad, rejections: Rejections) -> Any:
    """``events.metric_value_problem``'s rules on whole columns."""
    value, total = table.column("value"), table.column("sum_value")
    bad = _count_and_merge(bad, pc.invert(pc.is_finite(value)), NON_FINITE_METRIC_VALUE,
                           rejections, value)
    for kind, reason in NEGATIVE_METRIC_VALUE.items():
        negative = pc.and_(pc.equal(table.column("kind"), kind), pc.less(value, 0))
        bad = _count_and_merge(bad, negative, reason, rejections, value)
    endless = pc.fill_null(pc.invert(pc.is_finite(total)), False)
    return _count_and_merge(bad, endless, NON_FINITE_METRIC_SUM, rejections, total)


def _bounds_and_sums(record_type: type, table: pa.Table, bad, rejections: Rejections) -> Any:
    """Upper bounds and the served-tokens sum; a row already left out is not counted again."""
    def fresh(broken):
        return broken if bad is None else pc.and_(broken, pc.invert(bad))

    for name, limit in upper_bounds(record_type):
        column = table.column(name)
        above = fresh(pc.fill_null(pc.greater(column, limit), False))  # +inf too
        bad = _count_and_merge(bad, above, f"{name} above {limit:g}", rejections, column)
    if record_type is RequestRecord:
        served = None
        for name in SERVED_TOKEN_FIELDS:
            tokens = pc.fill_null(table.column(name), 0)
            served = tokens if served is None else pc.add(served, tokens)
        over = fresh(pc.fill_null(pc.greater(served, table.column("prompt_tokens")), False))
        bad = _count_and_merge(bad, over, SERVED_OVER_PROMPT, rejections, None)
    return bad


def _count_and_merge(bad, broken, reason: str, rejections: Rejections, column) -> Any:
    count = pc.sum(broken).as_py() or 0
    if count:
        example = None
        if column is not None:
            example = column.filter(broken)[0].as_py()
        rejections.add(reason, count, example)
    return broken if bad is None else pc.or_(bad, broken)


def empty_table(record_type: type) -> pa.Table:
    """A zero-row table with the record type's Arrow schema."""
    return pa.table({c.name: pa.array([], type=c.arrow_type) for c in columns_of(record_type)})
