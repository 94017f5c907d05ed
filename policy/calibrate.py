"""Cost parameters fitted to what an engine measured, in the form ``policy/cost.py`` uses.

From a store's records (``kvtier calibrate STORE``):

* **CPU→GPU promotion**: one *job* per request and tier (the promotion events of one load
  share its time and its latency); ``latency_s = cpu_gpu_op_latency_s + bytes /
  cpu_gpu_bandwidth_bytes_per_s``, fitted by least squares over the jobs (when the jobs do
  not vary enough in size for a line, or the line is not physical, the bandwidth is the mean
  throughput and the op latency negligible). Cold promotions likewise for the cold→CPU leg.
* **Prefill**: per request that ran alone (no other request in flight during it, so its
  TTFT holds no queueing or batching: :func:`ran_alone`), ``ttft_s − promotion time =
  request_overhead_s + recomputed_tokens / prefill_tokens_per_s``, a least-absolute-deviation
  line (a loaded host's slow outliers would drag a least-squares line off the median).
* **KV bytes per token**: the promotion and store events' ``size_bytes`` over the block size.

Every fitted value is a ``"measured"`` :class:`kvtier.policy.cost.Param`; what the store cannot tell
(no cold promotions) keeps its default. :meth:`Calibration.to_json` writes the parameters as
``kvtier simulate --cost-params`` and ``recommend`` read them (``measured_cost_params``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.collector.promotion_jobs import PromotionJob
from kvtier.policy.cost import CostParams, Param
from kvtier.policy.geometry import geometry_for

MIN_JOBS_FOR_A_LINE = 3
_NOTE = "fitted by kvtier calibrate from the store's measured latencies"


@dataclass(frozen=True)
class LineFit:
    """``y = intercept + slope * x`` and how well it fits."""

    intercept: float
    slope: float
    points: int
    rms_residual: float


@dataclass(frozen=True)
class Calibration:
    """The fitted parameters and the fits behind them."""

    params: CostParams
    prefill: LineFit | None
    promotion: dict[str, LineFit]  # tier -> latency over bytes
    bytes_per_token: int | None

    def fitted(self) -> dict[str, float]:
        """The parameters this calibration measured, by name."""
        return {name: getattr(self.params, name).value
                for name, source in self.params.sources().items() if source == "measured"}

    def to_json(self) -> str:
        fits = {"prefill": _fit_dict(self.prefill),
                **{f"{tier}_promotion": _fit_dict(fit) for tier, fit in self.promotion.items()}}
        return json.dumps({"probe": "calibrate", "cost_params": self.fitted(),
                           "kv_bytes_per_token": self.bytes_per_token, "fits": fits}, indent=2)


def calibrate(requests: Sequence[RequestRecord], jobs: Sequence[PromotionJob], *,
              bytes_per_token: int | None = None, base: CostParams = CostParams()) -> Calibration:
    """Fit the cost parameters (see module doc). ``requests`` need ``ttft_s`` and their
    per-tier tokens; ``ValueError`` when none has both."""
    params = base if bytes_per_token is None else replace(base, model=geometry_for(bytes_per_token))
    params, promotion = fit_promotions(jobs, params)
    usable = [r for r, alone in zip(requests, ran_alone(requests))
              if alone and r.ttft_s is not None and r.recomputed_tokens is not None]
    if not usable:
        raise ValueError("no request that ran alone with a measured TTFT and a tier split to "
                         "fit; the store needs records from an engine probe (kvtier's vLLM "
                         "connector, the reference engine) of a run at concurrency 1")
    residual = [r.ttft_s - params.promotion_s(r.cpu_promotion_tokens or 0, "cpu")
                - params.promotion_s(r.cold_promotion_tokens or 0, "cold") for r in usable]
    prefill = _line([r.recomputed_tokens for r in usable], residual, robust=True)
    if prefill is not None and prefill.slope > 0:
        params = replace(params, prefill_tokens_per_s=Param(1.0 / prefill.slope, "measured", _NOTE))
        if prefill.intercept > 0:
            params = replace(params, request_overhead_s=Param(prefill.intercept, "measured", _NOTE))
    return Calibration(params, prefill, promotion, bytes_per_token)


def fit_promotions(jobs: Sequence[PromotionJob], params: CostParams
                   ) -> tuple[CostParams, dict[str, LineFit]]:
    """``params`` with each tier's promotion op latency and bandwidth fitted to ``jobs``
    (tiers without jobs keep theirs), and the fits by tier."""
    promotion: dict[str, LineFit] = {}
    for tier, op_name, bw_name in (("cpu", "cpu_gpu_op_latency_s", "cpu_gpu_bandwidth_bytes_per_s"),
                                   ("cold", "cold_cpu_op_latency_s", "cold_cpu_bandwidth_bytes_per_s")):
        tier_jobs = [j for j in jobs if j.tier == tier and j.latency_s > 0 and j.size_bytes > 0]
        fit = _promotion_fit(tier_jobs)
        if fit is None:
            continue
        promotion[tier] = fit
        params = replace(params, **{op_name: Param(fit.intercept, "measured", _NOTE),
                                    bw_name: Param(1.0 / fit.slope, "measured", _NOTE)})
    return params, promotion


def _promotion_fit(jobs: Sequence[PromotionJob]) -> LineFit | None:
    if not jobs:
        return None
    sizes = np.array([j.size_bytes for j in jobs], dtype=float)
    latency = np.array([j.latency_s for j in jobs], dtype=float)
    fit = _line(sizes, latency) if len(jobs) >= MIN_JOBS_FOR_A_LINE else None
    if fit is not None and fit.slope > 0 and fit.intercept > 0:
        return fit
    # Too few jobs, or sizes too alike for a slope: all the time is put on the bandwidth (the
    # mean throughput), the op latency taken as negligible (1 µs).
    op = 1e-6
    slope = max(float((latency - op).clip(min=0).sum() / sizes.sum()), 1e-15)
    predicted = op + slope * sizes
    return LineFit(op, slope, len(jobs), float(np.sqrt(np.mean((latency - predicted) ** 2))))


def ran_alone(requests: Sequence[RequestRecord]) -> list[bool]:
    """For each request, whether no other request was in flight at any time between its
    arrival and its end (``arrival_s + e2e_latency_s``); unknown ends count as overlapping."""
    spans = [(r.arrival_s, r.arrival_s + r.e2e_latency_s if r.e2e_latency_s is not None else None)
             for r in requests]
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    alone = [end is not None for _, end in spans]
    latest_end, latest = float("-inf"), None
    for i in order:
        start, end = spans[i]
        if latest is not None and start < latest_end:
            alone[i] = False
            alone[latest] = False
        if end is None:
            end = float("inf")
        if end > latest_end:
            latest_end, latest = end, i
    return alone


def _line(x, y, *, robust: bool = False, iterations: int = 50) -> LineFit | None:
    """Least squares, or (``robust``) least absolute deviations by reweighting."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    slope, intercept = np.polyfit(x, y, 1)
    for _ in range(iterations if robust else 0):
        weights = 1.0 / np.sqrt(np.maximum(np.abs(y - (intercept + slope * x)), 1e-6))
        slope, intercept = np.polyfit(x, y, 1, w=weights)
    rms = float(np.sqrt(np.mean((y - (intercept + slope * x)) ** 2)))
    return LineFit(float(intercept), float(slope), len(x), rms)


def _fit_dict(fit: LineFit | None) -> dict | None:
    if fit is None:
        return None
    return {"intercept": fit.intercept, "slope": fit.slope, "points": fit.points,
            "rms_residual": fit.rms_residual}
