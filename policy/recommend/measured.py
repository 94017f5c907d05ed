"""The cost model's parameters as an engine measured them, from a store's block events.

Each lookup outcome the engine records carries its latency: a recompute miss the prefill time
of its tokens, a CPU or cold promotion its copy (the events of one load share the load's
time and latency: one job). The median seconds per token of each (per job) becomes
the matching parameter, marked measured: ``prefill_tokens_per_s`` from recompute misses, the
CPU->GPU path from CPU promotions (its per-request operation latency folded into the
per-token figure), and the cold promotion's cost for the cold tier's decision. Outcomes the
store has no latencies for keep the parameter they had (vLLM's hooks time promotions, not
recomputes: prefill speed then stays as it was, for ``--cost-params`` to set). An event
without ``tokens`` counts ``size_bytes`` over the KV bytes per token, when the geometry was
measured or given.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvtier.policy.cost import CostParams, Param
from kvtier.policy.recommend.cold_tier import cost_from_latencies
from kvtier.policy.recommend.values import ColdCost

FOLDED_OP_LATENCY_S = 1e-9  # the path's fixed cost is inside the measured per-token figure


# A job's latency per token, as the engine measured it: one load is one job (its events share
# the job's latency: kvtier.collector.promotion_jobs), its tokens the events' (an event
# without tokens, as vLLM's hooks write them, counts its bytes' worth).
_KIND_OF_TIER = {"cpu": "cpu_promotion", "cold": "cold_promotion", "recompute": "recompute_miss"}


def per_token_latencies(reader, bytes_per_token: float | None = None
                        ) -> tuple[dict[str, float], str | None]:
    """Median seconds per token of each lookup outcome with latencies behind ``reader`` (a
    store's or a segment folder's reader), and where they came from (``None``: a trace).
    ``bytes_per_token`` prices an event that carries bytes but no tokens (``None``: such
    events are left out)."""
    from kvtier.collector.promotion_jobs import read_jobs

    found = read_jobs(reader, recompute=True)
    if found is None:
        return {}, None
    jobs, where = found
    per_token: dict[str, list[float]] = {}
    for job in jobs:
        tokens = job.tokens_at(bytes_per_token)
        if job.latency_s > 0 and tokens and tokens > 0 and job.tier in _KIND_OF_TIER:
            per_token.setdefault(_KIND_OF_TIER[job.tier], []).append(job.latency_s / tokens)
    return {kind: float(np.median(values)) for kind, values in per_token.items()}, where


def store_costs(reader, params: CostParams, block_tokens: int
                ) -> tuple[CostParams, ColdCost | None]:
    """``params`` with what the engine measured behind ``reader``, and the measured cold cost
    (``None``: no cold promotions were measured, or ``reader`` reads a trace)."""
    # bytes convert to tokens only with a geometry that is not an assumption
    per_token = params.model.bytes_per_token if params.model.source != "default" else None
    measured, source = per_token_latencies(reader, per_token)
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
