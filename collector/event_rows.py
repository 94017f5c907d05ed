"""Aggregate queries over the block events behind a store or segment reader.

``kvtier.collector.reader`` yields request records; some figures live only in the block
events (their bytes, their latencies). :func:`block_event_rows` runs one aggregate query over
the events a reader reads (the same instance, the same store or segment folder), so callers
in ``policy/`` never open DuckDB themselves.
"""

from __future__ import annotations

from kvtier.collector.ddl import BLOCK_EVENTS_TABLE, WITH_ORIGIN

QUIET = "SET enable_progress_bar = false"  # DuckDB draws it on stdout: maybe a --json answer


def block_event_rows(reader, sql: str) -> tuple[list[dict], str] | None:
    """Rows of ``sql`` (its ``{events}`` is the block-events relation) and where they came
    from (``"the store PATH"``, ``"the segments in DIR"``); ``None`` when ``reader`` reads a
    trace, which has no block events. Only the reader's instance, when it has one."""
    return table_rows(reader, sql, BLOCK_EVENTS_TABLE)


def table_rows(reader, sql: str, table: str) -> tuple[list[dict], str] | None:
    """:func:`block_event_rows` for any of the store's tables (``metric_intervals``...):
    ``sql``'s ``{events}`` is that table's relation, with its origin columns."""
    store, root = getattr(reader, "store", None), getattr(reader, "root", None)
    instance = getattr(reader, "instance", None)
    if store is not None:
        relation = _of_instance(WITH_ORIGIN[table], instance)
        return store.query(sql.format(events=relation)).to_pylist(), f"the store {store.path}"
    if root is None:
        return None
    import duckdb

    from kvtier.collector.segments import has_segments, segments_relation

    where = f"the segments in {root}"
    if not has_segments(root, table):
        return [], where
    con = duckdb.connect()
    try:
        con.execute(QUIET)
        relation = _of_instance(segments_relation(root, table), instance)
        return con.sql(sql.format(events=relation)).to_arrow_table().to_pylist(), where
    finally:
        con.close()


def _of_instance(relation: str, instance: str | None) -> str:
    if instance is None:
        return relation
    quoted = instance.replace("'", "''")
    return f"(SELECT * FROM {relation} WHERE instance = '{quoted}')"


# Bytes per token from the block events that carry bytes: exact where an event says its
# tokens; an event without tokens (vLLM's hooks, older stores) is one block of the trace.
_KV_BYTES_SQL = """
    SELECT median(size_bytes / tokens) FILTER (WHERE tokens > 0) AS per_token,
           median(size_bytes) FILTER (WHERE tokens IS NULL OR tokens <= 0) AS per_block
    FROM {events} WHERE size_bytes > 0"""


def recorded_kv_bytes(reader, block_tokens: int | None) -> tuple[int, str, str] | None:
    """The KV bytes per token the block events behind ``reader`` carry (an even number: a
    key and a value), how they were read (``"bytes over tokens"``, or per block of
    ``block_tokens``) and where; ``None`` for a trace or events without bytes."""
    found = block_event_rows(reader, _KV_BYTES_SQL)
    if not found or not found[0]:
        return None
    (row,), where = found
    if row["per_token"]:
        per_token, how = float(row["per_token"]), "bytes over tokens"
    elif row["per_block"] and block_tokens and block_tokens > 0:
        per_token = float(row["per_block"]) / block_tokens
        how = f"{row['per_block']:,.0f} bytes per {block_tokens}-token block"
    else:
        return None
    return max(2, 2 * round(per_token / 2)), how, where
