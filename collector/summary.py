"""A plain summary of what a store holds (for ``kvtier store info`` and the demo)."""

from __future__ import annotations

from kvtier.collector.ddl import BLOCK_EVENTS_TABLE, LEDGER_TABLE, REQUESTS_TABLE, STEP_RECORDS_TABLE
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
        "step_records": store.count(STEP_RECORDS_TABLE),
    }
    span = store.query(f"SELECT min(time_s) AS lo, max(time_s) AS hi FROM {BLOCK_EVENTS_TABLE}").to_pylist()[0]
    summary["block_events_span_s"] = (span["hi"] - span["lo"]) if span["lo"] is not None else None
    kinds = store.query(f"SELECT CAST(kind AS VARCHAR) AS kind, count(*) AS n FROM {BLOCK_EVENTS_TABLE} "
                        "GROUP BY ALL ORDER BY kind").to_pylist()
    summary["block_events_by_kind"] = {row["kind"]: row["n"] for row in kinds}
    return summary


def segments_summary(root) -> dict:
    """:func:`store_summary` from a store's Parquet segments (what a running collector has
    exported): the same counts, span and kinds; the ledger's batches, sources and rejected
    rows stay in the store, so they are ``None``."""
    import duckdb

    from kvtier.collector.segments import has_segments, segments_relation

    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")

        def rows(table: str, sql: str) -> list:
            if not has_segments(root, table):
                return []
            return con.sql(sql.format(t=segments_relation(root, table))).fetchall()

        (count,), = rows(REQUESTS_TABLE, "SELECT count(*) FROM {t}") or [(0,)]
        (steps,), = rows(STEP_RECORDS_TABLE, "SELECT count(*) FROM {t}") or [(0,)]
        (events, lo, hi), = rows(BLOCK_EVENTS_TABLE,
                                 "SELECT count(*), min(time_s), max(time_s) FROM {t}") or [(0, None, None)]
        kinds = rows(BLOCK_EVENTS_TABLE, "SELECT CAST(kind AS VARCHAR), count(*) FROM {t} "
                                         "GROUP BY ALL ORDER BY 1")
    finally:
        con.close()
    return {"path": str(root), "batches": None, "sources": None, "rejected_rows": None,
            "block_events": events, "requests": count, "step_records": steps,
            "block_events_span_s": (hi - lo) if lo is not None else None,
            "block_events_by_kind": dict(kinds)}
