"""The tier-aware headroom signal an autoscaler can read: how much more load an instance
takes before its TTFT budget breaks, given what its tiers serve.

From an instance's latest requests (arrival, prompt tokens and the tier split the engine
measured): the prompt tokens each tier served per second (the prefill the tiers saved), and,
under kvtier's single-server queue model (:mod:`kvtier.policy.cost`, one prefill server per
instance, each request's service its promotions plus its recompute), the factor ``k`` by
which the arrival rate can grow (the same requests, ``k`` times closer together) before the
p99 TTFT passes the budget: ``k > 1`` is room, ``k < 1`` load to shed. The same with every
CPU- and file-served token recomputed says what the offload tiers are worth in load. The
costs are a cost file's (``kvtier calibrate --out``: ``costs = "calibrated"``) or kvtier's
documented defaults (``"default"``: then the factor rests on an assumed prefill speed).
"""

from __future__ import annotations

import numpy as np

from kvtier.policy.cost import CostParams, queue_ttft_samples
from kvtier.policy.livecurve.curve_values import Headroom

FACTOR_RANGE = (1 / 64, 64.0)
STEPS = 14  # bisection steps on log(factor): 2^(12/14) apart at the end, under 1%


def headroom(rows: np.ndarray, params: CostParams, costs: str, ttft_budget_s: float) -> Headroom | None:
    """``rows`` are (arrival_s, prompt, gpu, cpu, cold, recomputed) in arrival order;
    ``None`` for fewer than two requests."""
    if len(rows) < 2:
        return None
    arrivals = rows[:, 0] - rows[0, 0]
    span_s = max(float(arrivals[-1]), 1.0)
    gpu, cpu, cold, recomputed = (rows[:, i].astype(np.int64) for i in range(2, 6))
    served = [params.service_s(int(c), int(k), int(r)) for c, k, r in zip(cpu, cold, recomputed)]
    plain = [params.service_s(0, 0, int(r + c + k)) for c, k, r in zip(cpu, cold, recomputed)]
    return Headroom(
        ttft_budget_s, costs, len(rows), span_s,
        {"gpu": float(gpu.sum()) / span_s, "cpu": float(cpu.sum()) / span_s,
         "cold": float(cold.sum()) / span_s},
        float(recomputed.sum()) / span_s, float(sum(served)) / span_s,
        load_factor(arrivals, np.array(served), ttft_budget_s),
        load_factor(arrivals, np.array(plain), ttft_budget_s))


def p99_ttft_s(arrivals_s: np.ndarray, services_s: np.ndarray, factor: float) -> float:
    """The p99 TTFT of the requests arriving ``factor`` times as fast."""
    return float(np.percentile(queue_ttft_samples(arrivals_s / factor, services_s), 99))


def load_factor(arrivals_s: np.ndarray, services_s: np.ndarray, budget_s: float) -> float:
    """The largest factor in :data:`FACTOR_RANGE` whose p99 TTFT stays within ``budget_s``
    (its low end when none does, its high end when all do)."""
    low, high = np.log(FACTOR_RANGE[0]), np.log(FACTOR_RANGE[1])
    if p99_ttft_s(arrivals_s, services_s, FACTOR_RANGE[0]) > budget_s:
        return FACTOR_RANGE[0]
    if p99_ttft_s(arrivals_s, services_s, FACTOR_RANGE[1]) <= budget_s:
        return FACTOR_RANGE[1]
    for _ in range(STEPS):
        middle = (low + high) / 2
        if p99_ttft_s(arrivals_s, services_s, float(np.exp(middle))) <= budget_s:
            low = middle
        else:
            high = middle
    return float(np.exp(low))


def saved_s_per_token(params: CostParams, block_tokens: int, path: str) -> float:
    """Prefill seconds a token served over ``path`` (``cpu`` or ``cold``) saves against its
    recompute, per block (each promotion moves a block), as ``recommend`` sizes tiers."""
    return (params.recompute_s(block_tokens) - params.promotion_s(block_tokens, path)) / block_tokens
