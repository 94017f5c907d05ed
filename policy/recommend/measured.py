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

from policy.cost import CostParams, Param
from policy.recommend.cold_tier import cost_from_latencies
from policy.recommend.values import ColdCost

FOLDED_OP_LATENCY_S = 1e-9  # the path's fixed cost is inside the measured per-token figure


def per_token_latencies(store) -> dict[str, float]:
    """Median seconds per token of each lookup outcome with latencies in ``store``."""
    rows = store.query("""
        SELECT CAST(kind AS VARCHAR) AS kind, median(latency_s / tokens) AS s_per_token
        FROM block_events
        WHERE latency_s IS NOT NULL AND latency_s > 0 AND tokens > 0
          AND CAST(kind AS VARCHAR) IN ('cpu_promotion', 'cold_promotion', 'recompute_miss')
        GROUP BY ALL""").to_pylist()
    return {row["kind"]: float(row["s_per_token"]) for row in rows}


def store_costs(store, params: CostParams, block_tokens: int
                ) -> tuple[CostParams, ColdCost | None]:
    """``params`` with what ``store`` measured, and the measured cold cost (``None``: no
    cold promotions were measured)."""
    measured = per_token_latencies(store)
    where = f"median per token in the store {store.path}"
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
                               f"the store {store.path}")
    return params, cold
