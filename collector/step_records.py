"""An engine's scheduler steps as columns, for fitting a step-level engine model.

:func:`read_step_records` reads the ``step_records`` table of a store (a live
:class:`~kvtier.collector.store.TraceStore`, a store file opened read-only, or the Parquet
segments a collector exports) and returns, per serving instance, one Arrow table of the
``StepRecord`` columns (``collector/events.py``) plus ``source`` (the recorder stream: an
engine process, a data-parallel rank), sorted by ``source``, ``time_s`` and ``step``.
``table.column("prefill_tokens").to_numpy()`` gives numpy arrays; ``duration_s`` may hold
nulls (a step whose end the engine did not see).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from kvtier.collector.columns import STEP_COLUMNS
from kvtier.collector.ddl import STEP_RECORDS_TABLE, WITH_ORIGIN
from kvtier.collector.store import TraceStore

STEP_FIELDS = tuple(c.name for c in STEP_COLUMNS)
_QUIET = "SET enable_progress_bar = false"  # DuckDB draws it on stdout: maybe a --json answer


def read_step_records(where: TraceStore | str | Path, *, instance: str | None = None,
                      engine: str | None = None) -> dict[str, pa.Table]:
    """Instance name -> its step records (see module doc), instances sorted by name.

    ``where`` is a ``TraceStore``, a store file (opened read-only: the file is not changed)
    or a segment folder. With ``instance``, only that instance (an empty dict if it has no
    steps); with ``engine``, only the steps origins of that engine recorded. A store without
    step records gives an empty dict.
    """
    if isinstance(where, TraceStore):
        return _split(where.query(_sql(WITH_ORIGIN[STEP_RECORDS_TABLE], instance, engine)))
    path = Path(where)
    if path.is_dir():
        return _from_segments(path, instance, engine)
    if not path.is_file():
        raise FileNotFoundError(2, "no store file or segment folder", str(path))
    with TraceStore(path, read_only=True) as store:
        return _split(store.query(_sql(WITH_ORIGIN[STEP_RECORDS_TABLE], instance, engine)))


def _from_segments(root: Path, instance: str | None, engine: str | None) -> dict[str, pa.Table]:
    import duckdb

    from kvtier.collector.segments import has_segments, segments_relation

    if not has_segments(root, STEP_RECORDS_TABLE):
        return {}
    con = duckdb.connect()
    try:
        con.execute(_QUIET)
        return _split(con.sql(_sql(segments_relation(root, STEP_RECORDS_TABLE), instance, engine))
                      .to_arrow_table())
    finally:
        con.close()


def _sql(relation: str, instance: str | None, engine: str | None) -> str:
    columns = ", ".join(STEP_FIELDS)
    conditions = [f"{column} = '" + value.replace("'", "''") + "'"
                  for column, value in (("instance", instance), ("engine", engine))
                  if value is not None]
    where = "WHERE " + " AND ".join(conditions) if conditions else ""
    return (f"SELECT CAST(instance AS VARCHAR) AS instance, source, {columns} FROM {relation} "
            f"{where} ORDER BY instance, source, time_s, step")


def _split(table: pa.Table) -> dict[str, pa.Table]:
    out: dict[str, pa.Table] = {}
    names = table.column("instance").to_pylist()
    start = 0
    for i in range(1, len(names) + 1):  # rows arrive sorted by instance
        if i == len(names) or names[i] != names[start]:
            out[names[start]] = table.slice(start, i - start).drop_columns(["instance"])
            start = i
    return out
