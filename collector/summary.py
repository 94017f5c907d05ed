"""A plain summary of what a store holds (for ``kvtier store info`` and the demo)."""

from __future__ import annotations

from kvtier.collector.ddl import BLOCK_EVENTS_TABLE, LEDGER_TABLE, REQUESTS_TABLE
from kvtier.collector.store import TraceStore


def store_summary(store: TraceStore) -> dict:
    """Counts and time range per table, batches, rejected rows, and outcomes by kind."""
    summary = {
        "path": store.path,
        "batches": store.count(LEDGER_TABLE),
        "sources": store.scalar(f"SELECT count(DISTINCT source) FROM {LEDGER_TABLE}"),
        "rejected_rows": store.scalar(f"SELECT coalesce(sum(rejected), 0) FROM {LEDGER_TABLE}"),
        "block_events": store.count(BLOCK_EVENTS_TABLE),
        "requests": store.count(REQUESTS_TABLE),
    }
    span = store.query(f"SELECT min(time_s) AS lo, max(time_s) AS hi FROM {BLOCK_EVENTS_TABLE}").to_pylist()[0]
    summary["block_events_span_s"] = (span["hi"] - span["lo"]) if span["lo"] is not None else None
    kinds = store.query(f"SELECT CAST(kind AS VARCHAR) AS kind, count(*) AS n FROM {BLOCK_EVENTS_TABLE} "
                        "GROUP BY ALL ORDER BY kind").to_pylist()
    summary["block_events_by_kind"] = {row["kind"]: row["n"] for row in kinds}
    return summary
