"""The cost model's parameters as an engine measured them, from a store's block events.

Each lookup outcome the engine records carries its latency: a recompute miss the prefill time
of its tokens, a CPU or cold promotion its copy. The median seconds per token of each becomes
the matching parameter, marked measured: ``prefill_tokens_per_s`` from recompute misses, the
CPU->GPU path from CPU promotions (its per-request operation latency folded into the
per-token figure), and the cold promotion's cost for the cold tier's decision. Outcomes the
store has no latencies for keep the parameter they had.
"""

from __future__ import annotations

from dataclasses import replace

from kvtier.policy.cost import CostParams, Param
from kvtier.policy.recommend.cold_tier import cost_from_latencies
from kvtier.policy.recommend.values import ColdCost

FOLDED_OP_LATENCY_S = 1e-9  # the path's fixed cost is inside the measured per-token figure


_SQL = """
    SELECT CAST(kind AS VARCHAR) AS kind, median(latency_s / tokens) AS s_per_token
    FROM {events}
    WHERE latency_s IS NOT NULL AND latency_s > 0 AND tokens > 0
      AND CAST(kind AS VARCHAR) IN ('cpu_promotion', 'cold_promotion', 'recompute_miss')
    GROUP BY ALL"""


def per_token_latencies(reader) -> tuple[dict[str, float], str | None]:
    """Median seconds per token of each lookup outcome with latencies behind ``reader`` (a
    store's or a segment folder's reader), and where they came from (``None``: a trace)."""
    store, root = getattr(reader, "store", None), getattr(reader, "root", None)
    if store is not None:
        rows, where = store.query(_SQL.format(events="block_events")).to_pylist(), f"the store {store.path}"
    elif root is not None:
        import duckdb

        from kvtier.collector.segments import has_segments, segments_relation

        if not has_segments(root, "block_events"):
            return {}, None
        con = duckdb.connect()
        try:
            rows = con.sql(_SQL.format(events=segments_relation(root, "block_events"))).to_arrow_table().to_pylist()
        finally:
            con.close()
        where = f"the segments in {root}"
    else:
        return {}, None
    return {row["kind"]: float(row["s_per_token"]) for row in rows}, where


def store_costs(reader, params: CostParams, block_tokens: int
                ) -> tuple[CostParams, ColdCost | None]:
    """``params`` with what the engine measured behind ``reader``, and the measured cold cost
    (``None``: no cold promotions were measured, or ``reader`` reads a trace)."""
    measured, source = per_token_latencies(reader)
    if source is None:
        return params, None
    where = f"median per token in {source}"
    recompute = measured.get("recompute_miss")
    if recompute:
        params = replace(params, prefill_tokens_per_s=Param(1.0 / recompute, "measured", where))
    cpu = measured.get("cpu_promotion")
    if cpu:
        params = replace(
            params, cpu_gpu_bandwidth_bytes_per_s=Param(params.model.bytes_per_token / cpu,
                                                        "measured", where),
            cpu_gpu_op_latency_s=Param(FOLDED_OP_LATENCY_S, "measured",
                                       "folded into the measured per-token figure"))
    cold = cost_from_latencies(block_tokens, measured.get("cold_promotion"), recompute, params,
                               source)
    return params, cold
