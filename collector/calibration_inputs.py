"""What a calibration reads from a store: the selected requests, and the steps and promotion
jobs of the same selection.

:func:`calibration_inputs` selects request records with a tier split by serving instance,
engine, tier configuration and span of arrivals, and takes the step records and promotion
jobs (:mod:`kvtier.collector.promotion_jobs`) of that selection alone: the selected
instances' (a second instance's steps never move the first one's fit), and, when a tier
configuration or a span is selected, per instance only those between the first selected
request's arrival and the last one's end (another phase's steps and jobs stay out; a job
also belongs to a selected request). It reads through the store's readers
(:mod:`kvtier.collector.reader`, :mod:`kvtier.collector.step_records`), so a store held by a
running collector is read through the Parquet segments it exports, and says so.

With no engine named, where a load client (``CLIENT_ENGINES``) recorded the same requests
as the engine serving them, it reads the engine's records alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kvtier.collector.ddl import REQUESTS_TABLE
from kvtier.collector.event_rows import block_event_rows, recorded_kv_bytes, table_rows
from kvtier.collector.events import CLIENT_ENGINES, RequestRecord, StepRecord
from kvtier.collector.promotion_jobs import PromotionJob, jobs_of, jobs_sql
from kvtier.collector.reader import SegmentReader, StoreReader, open_store
from kvtier.collector.request_tokens import RequestTokens
from kvtier.collector.step_records import STEP_FIELDS, read_step_records
from kvtier.collector.store import TraceStore


@dataclass(frozen=True)
class CalibrationInputs:
    """The selected request records with a tier split, in arrival order, and each one's
    ``splits`` (the same order); the step records of the selection in (time, step) order;
    its promotion jobs in time order; the KV bytes per token the block events carry
    (``None``: none carry bytes); the engines whose records were selected; where they were
    read (``"the store PATH"``, ``"the segments in DIR"``) and why there (``note``: a store
    held by a running collector, read through its segments)."""

    requests: tuple[RequestRecord, ...]
    splits: tuple[RequestTokens, ...]
    steps: tuple[StepRecord, ...]
    jobs: tuple[PromotionJob, ...]
    kv_bytes_per_token: int | None
    engines: tuple[str, ...]
    source: str
    note: str | None = None


def calibration_inputs(where: TraceStore | str | Path, *, instance: str | None = None,
                       engine: str | None = None, tier_config: str | None = None,
                       span: tuple[float, float] | None = None) -> CalibrationInputs:
    """The selection's records (see the module doc) from ``where``: a live ``TraceStore``, a
    store file (opened read-only; the file is not changed) or a folder of Parquet segments.
    ``span`` keeps requests that arrived in ``[start_s, end_s)`` (Unix seconds). With no
    ``engine`` named, where one engine probe and a load client (``CLIENT_ENGINES``: its view
    of the same requests, no step records) both recorded the selection, the engine's records
    alone, said in ``note``: read together each request counts twice (the demo's CPU-tier
    phase of 414 requests read as 828, and the engine model fitted and checked on them missed
    its held-out TTFT p50 by 4.4x). Several engine probes are left as selected.

    ``StoreLockedError`` when the file is held by another process that exports no segments;
    ``FileNotFoundError`` when ``where`` does not exist; ``ValueError`` for a bad span or a
    segment file that cannot be read."""
    if span is not None and not (all(map(math.isfinite, span)) and span[0] < span[1]):
        raise ValueError(f"span must be two finite times, start before end, got {span!r}")
    reader, opened = _reader(where, instance, engine, tier_config)
    said = None
    try:
        if engine is None:  # a load client's view of the engine's own requests is left out
            engines = _engines(reader)
            own = sorted(engines - CLIENT_ENGINES)
            if len(own) == 1 and engines & CLIENT_ENGINES:
                if opened is not None:
                    opened.close()
                reader, opened = _reader(where, instance, own[0], tier_config)
                said = (f"read {own[0]}'s own records; "
                        f"{', '.join(sorted(engines & CLIENT_ENGINES))}'s view of the same "
                        "requests left out")
        parts = [_instance_part(one, span, tier_config is not None or span is not None)
                 for one in _per_instance(reader)]
        requests = sorted((r for part in parts for r in part.requests), key=lambda r: r.arrival_s)
        kv = recorded_kv_bytes(reader, requests[0].block_size_tokens if requests else None)
    finally:
        if opened is not None:
            opened.close()
    return CalibrationInputs(
        tuple(requests), tuple(RequestTokens.measured(r) for r in requests),
        tuple(sorted((s for part in parts for s in part.steps), key=lambda s: (s.time_s, s.step))),
        tuple(sorted((j for part in parts for j in part.jobs), key=lambda j: j.time_s or 0.0)),
        kv[0] if kv else None, tuple(sorted({e for part in parts for e in part.engines})),
        _source(reader), "; ".join(n for n in (getattr(reader, "note", None), said) if n) or None)


@dataclass(frozen=True)
class _Part:
    """One instance's share of a selection."""

    requests: tuple[RequestRecord, ...] = ()
    steps: tuple[StepRecord, ...] = ()
    jobs: tuple[PromotionJob, ...] = ()
    engines: frozenset[str] = frozenset()


def _reader(where, instance, engine, tier_config) -> tuple[StoreReader | SegmentReader,
                                                           TraceStore | None]:
    """A request reader over ``where`` with the selection, and the store it opened (for the
    caller to close), if it opened one."""
    select = {"tier_config_id": tier_config, "instance": instance, "engine": engine}
    if isinstance(where, TraceStore):
        return StoreReader(where, **select), None
    path = Path(where)
    if path.is_dir():
        return SegmentReader(path, **select), None
    if not path.is_file():
        raise FileNotFoundError(2, "no store file or segment folder", str(path))
    reader = open_store(path, **select)
    return reader, getattr(reader, "store", None)


def _per_instance(reader) -> list[StoreReader | SegmentReader]:
    """``reader`` once per serving instance it reads whose requests carry a tier split."""
    if reader.instance is not None:
        return [reader]
    found = table_rows(reader, "SELECT DISTINCT CAST(instance AS VARCHAR) AS instance FROM "
                               "{events} WHERE gpu_hit_tokens IS NOT NULL ORDER BY 1", REQUESTS_TABLE)
    names = [row["instance"] for row in found[0]] if found else []
    select = {"tier_config_id": reader.tier_config_id, "engine": reader.engine}
    if isinstance(reader, StoreReader):
        return [StoreReader(reader.store, instance=name, **select) for name in names]
    return [SegmentReader(reader.root, instance=name, note=reader.note, **select) for name in names]


def _instance_part(reader, span, windowed: bool) -> _Part:
    """One instance's selected requests, and its steps and jobs: all of them, or (``windowed``)
    those from the first selected arrival to the last selected end, the jobs of selected
    requests only."""
    requests = tuple(r for r in reader.requests() if r.gpu_hit_tokens is not None
                     and (span is None or span[0] <= r.arrival_s < span[1]))
    if not requests:
        return _Part()
    window = None
    if windowed:
        window = (requests[0].arrival_s,
                  max(r.arrival_s + (r.e2e_latency_s or r.ttft_s or 0.0) for r in requests))
    steps = _steps(reader, window)
    jobs = _jobs(reader, window, {r.request_id for r in requests} if windowed else None)
    return _Part(requests, steps, jobs, _engines(reader))


def _steps(reader, window: tuple[float, float] | None) -> tuple[StepRecord, ...]:
    where = reader.store if isinstance(reader, StoreReader) else reader.root
    steps = []
    for table in read_step_records(where, instance=reader.instance, engine=reader.engine).values():
        for row in table.select(list(STEP_FIELDS)).to_pylist():
            if window is None or window[0] <= row["time_s"] <= window[1]:
                steps.append(StepRecord(**row))
    return tuple(steps)


def _jobs(reader, window: tuple[float, float] | None,
          request_ids: set[str] | None) -> tuple[PromotionJob, ...]:
    condition = "" if reader.engine is None else f"engine = {_literal(reader.engine)}"
    found = block_event_rows(reader, jobs_sql("{events}", where=condition))
    jobs = jobs_of(found[0]) if found else []
    if window is not None:
        jobs = [j for j in jobs if j.request_id in request_ids
                and j.time_s is not None and window[0] <= j.time_s <= window[1]]
    return tuple(jobs)


def _engines(reader) -> frozenset[str]:
    """The engines whose records with a tier split the reader's selection holds."""
    if reader.engine is not None:
        return frozenset({reader.engine})
    sql = ("SELECT DISTINCT CAST(engine AS VARCHAR) AS engine FROM {events} "
           "WHERE gpu_hit_tokens IS NOT NULL")
    if reader.tier_config_id is not None:
        sql += f" AND tier_config_id = {_literal(reader.tier_config_id)}"
    found = table_rows(reader, sql, REQUESTS_TABLE)
    return frozenset(row["engine"] for row in found[0] if row["engine"]) if found else frozenset()


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _source(reader) -> str:
    if isinstance(reader, StoreReader):
        return f"the store {reader.store.path}"
    return f"the segments in {reader.root}"
