"""The latency cost model: promotions, recompute, and queueing for TTFT percentiles.

* A promotion over a tier path costs one operation latency per request that uses the path
  (engines batch a request's blocks into one transfer) plus bytes / bandwidth.
  A cold promotion is staged through CPU: cold->CPU, then CPU->GPU.
* A recompute miss costs the prefill of the uncached tokens at ``prefill_tokens_per_s``
  (linear in tokens: attention's quadratic term is ignored, which flatters long prompts).
* An optional fixed cost per request (``request_overhead_s``: scheduling, the first decode
  step, whatever an engine spends on a fully cached prompt); unset by default, fitted from an
  engine's measured TTFT by ``kvtier calibrate``.
* Contention: requests share one prefill server in arrival order (Lindley's recursion,
  ``wait[n] = max(0, wait[n-1] + service[n-1] - gap[n])``), so TTFT = wait + service, and
  the p50/p95/p99 come from the replay's requests.

Every parameter carries its source: ``"measured"`` (from an active probe or the engine's
store), ``"calibrated"`` (fitted by ``kvtier calibrate`` and read from its file) or
``"default"`` (the documented assumption below); every estimate lists them.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kvtier.policy.geometry import DEFAULT_GEOMETRY, KVGeometry, geometry

SOURCES = ("measured", "calibrated", "default")


def _finite_positive(value) -> bool:
    try:
        return not isinstance(value, (bool, str)) and math.isfinite(value) and value > 0
    except TypeError:
        return False


@dataclass(frozen=True)
class Param:
    """One model parameter, its unit in the owning field's name, and where it came from."""

    value: float
    source: str = "default"
    note: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if not _finite_positive(self.value):
            raise ValueError(f"a cost parameter must be a finite number > 0, got {self.value!r}")


@dataclass(frozen=True)
class CostParams:
    """Defaults are assumptions for one H100-class GPU on PCIe Gen5 with a local NVMe file
    tier and an 8B-class model; replace them with probe measurements when available."""

    cpu_gpu_bandwidth_bytes_per_s: Param = Param(20e9, note="PCIe Gen5 x16, pinned, effective")
    cpu_gpu_op_latency_s: Param = Param(20e-6, note="one batched copy launch")
    cold_cpu_bandwidth_bytes_per_s: Param = Param(2e9, note="one local NVMe, O_DIRECT reads")
    cold_cpu_op_latency_s: Param = Param(200e-6, note="file open + first read")
    prefill_tokens_per_s: Param = Param(8000.0, note="8B-class model, one H100, batch of one")
    model: KVGeometry = field(default_factory=lambda: geometry(DEFAULT_GEOMETRY))
    request_overhead_s: Param | None = None
    # Attention makes a token dearer the deeper it sits: at position p its cost grows by
    # p / attention_equal_tokens of the rest (counting FLOPs of an 8B-class dense model:
    # 2 x 8e9 per token for the weights, 4 x 32 layers x 4,096 hidden x p for attention, equal
    # near p = 30k). Only ``prefill_s`` reads it; ``recompute_s`` (the TTFT model) stays linear.
    attention_equal_tokens: Param = Param(30_000.0, note="8B-class: weights' FLOPs = attention's")

    def sources(self) -> dict[str, str]:
        return {name: getattr(self, name).source for name in self.__dataclass_fields__
                if isinstance(getattr(self, name), Param)}

    def promotion_s(self, tokens: int, path: str) -> float:
        """Time to move ``tokens`` worth of KV over ``path`` ("cpu" or "cold"); 0 for none."""
        if tokens <= 0:
            return 0.0
        bytes_moved = tokens * self.model.bytes_per_token
        seconds = (self.cpu_gpu_op_latency_s.value
                   + bytes_moved / self.cpu_gpu_bandwidth_bytes_per_s.value)
        if path == "cold":
            seconds += (self.cold_cpu_op_latency_s.value
                        + bytes_moved / self.cold_cpu_bandwidth_bytes_per_s.value)
        elif path != "cpu":
            raise ValueError(f"path must be 'cpu' or 'cold', got {path!r}")
        return seconds

    def recompute_s(self, tokens: int) -> float:
        return tokens / self.prefill_tokens_per_s.value

    def prefill_s(self, start_token: int, tokens: int) -> float:
        """Seconds to prefill ``tokens`` tokens that follow ``start_token`` cached ones, with
        attention's growth with position (the integral of 1 + p / attention_equal_tokens)."""
        if tokens <= 0:
            return 0.0
        mean_position = start_token + tokens / 2
        return tokens / self.prefill_tokens_per_s.value * (
            1.0 + mean_position / self.attention_equal_tokens.value)

    def service_s(self, cpu_tokens: int, cold_tokens: int, recompute_tokens: int) -> float:
        """A request's time to first token without queueing."""
        overhead = self.request_overhead_s.value if self.request_overhead_s is not None else 0.0
        return (overhead + self.promotion_s(cpu_tokens, "cpu")
                + self.promotion_s(cold_tokens, "cold") + self.recompute_s(recompute_tokens))


AUTO_SERVERS_UTILISATION = 0.8
AUTO_SERVERS_WINDOW_S = 600.0  # bursts shorter than this queue; longer ones are sized for


def servers_for(records, params: CostParams,
                utilisation: float = AUTO_SERVERS_UTILISATION,
                window_s: float = AUTO_SERVERS_WINDOW_S) -> int:
    """The fewest prefill servers that keep ``utilisation`` or less when every prompt token
    of ``records`` (in arrival order) is recomputed, over the whole span and over its busiest
    ``window_s``: a deployment that survives a cold cache at its busiest ten minutes. With
    fewer, the queue model's TTFT grows through every burst (a trace whose requests crowd
    into part of its span would read hours of queueing) and says nothing about the tiers."""
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation!r}")
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s!r}")
    records = list(records)
    if len(records) < 2:
        return 1
    arrivals = [r.arrival_s for r in records]
    span = arrivals[-1] - arrivals[0]
    if span <= 0:
        return 1
    work = [params.recompute_s(r.prompt_tokens) for r in records]
    window = min(window_s, span)
    busiest, inside, first = 0.0, 0.0, 0
    for last, arrival in enumerate(arrivals):  # two pointers: work arriving in [t, t + window]
        inside += work[last]
        while arrivals[first] < arrival - window:
            inside -= work[first]
            first += 1
        busiest = max(busiest, inside)
    return max(1, math.ceil(sum(work) / (span * utilisation)),
               math.ceil(busiest / (window * utilisation)))


def parse_servers(text: str) -> int | None:
    """``--prefill-servers``: ``auto`` (``None``: size with :func:`servers_for`) or an int
    >= 1; ``ValueError`` otherwise."""
    if str(text).strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"--prefill-servers must be 'auto' or an int >= 1, got {text!r}")
    return value


@dataclass(frozen=True)
class TtftEstimate:
    """TTFT percentiles of a replay under the queueing model, with parameter sources."""

    requests: int
    p50_s: float
    p95_s: float
    p99_s: float
    mean_s: float
    mean_service_s: float
    utilisation: float
    parameter_sources: dict

    def to_dict(self) -> dict:
        return {"requests": self.requests, "ttft_p50_s": self.p50_s, "ttft_p95_s": self.p95_s,
                "ttft_p99_s": self.p99_s, "ttft_mean_s": self.mean_s,
                "mean_service_s": self.mean_service_s, "utilisation": self.utilisation,
                "parameter_sources": dict(self.parameter_sources)}


def queue_ttft_samples(arrivals_s: Iterable[float], services_s: Iterable[float],
                       servers: int = 1) -> np.ndarray:
    """Each request's TTFT through ``servers`` identical FIFO servers (Lindley's recursion;
    each request takes the server that frees first). ``arrivals_s`` must be non-decreasing;
    ties are served in the given order."""
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"servers must be an int >= 1, got {servers!r}")
    arrivals = np.asarray(list(arrivals_s), dtype=float)
    services = np.asarray(list(services_s), dtype=float)
    if arrivals.shape != services.shape:
        raise ValueError(f"{len(arrivals)} arrivals but {len(services)} service times")
    if len(arrivals) and np.any(np.diff(arrivals) < 0):
        raise ValueError("arrivals_s must be non-decreasing")
    ttft = np.empty_like(services)
    free_at = [-np.inf] * servers  # a heap of the times each server becomes free
    for i, (arrival, service) in enumerate(zip(arrivals.tolist(), services.tolist())):
        start = max(arrival, heapq.heappop(free_at))
        heapq.heappush(free_at, start + service)
        ttft[i] = start + service - arrival
    return ttft


def queue_ttft(arrivals_s: Iterable[float], services_s: Iterable[float],
               sources: dict | None = None, servers: int = 1) -> TtftEstimate:
    """:func:`queue_ttft_samples` summarised as percentiles. ``utilisation`` above 1 means
    the queue grows without bound over the trace."""
    arrivals = np.asarray(list(arrivals_s), dtype=float)
    services = np.asarray(list(services_s), dtype=float)
    ttft = queue_ttft_samples(arrivals, services, servers)
    if not len(ttft):
        return TtftEstimate(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, dict(sources or {}))
    span = max(arrivals[-1] - arrivals[0], 1e-9)
    return ttft_summary(ttft, float(services.mean()), float(services.sum() / (span * servers)),
                        sources)


def ttft_summary(ttft_s: np.ndarray, mean_service_s: float, utilisation: float,
                 sources: dict | None = None) -> TtftEstimate:
    """A :class:`TtftEstimate` of TTFT samples (also those of several instances together)."""
    if not len(ttft_s):
        return TtftEstimate(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, dict(sources or {}))
    p50, p95, p99 = np.percentile(ttft_s, [50, 95, 99])
    return TtftEstimate(len(ttft_s), float(p50), float(p95), float(p99), float(ttft_s.mean()),
                        mean_service_s, utilisation, dict(sources or {}))


def measured_cost_params(*results, base=None):
    """``CostParams`` with every parameter a result's ``cost_params`` names set as measured
    (``"calibrated"`` for the file ``kvtier calibrate --out`` writes).

    ``results`` are probe results (with ``cost_params()``), their ``to_dict()`` bodies, or
    paths to JSON files written by ``kvtier probe ... --out`` or ``kvtier calibrate --out``.
    """
    params = base or CostParams()
    for result in results:
        body = _probe_body(result)
        calibrated = body.get("probe") == "calibrate"
        for name, value in (body.get("cost_params") or {}).items():
            if not hasattr(params, name):
                raise ValueError(f"unknown cost parameter {name!r} in {body.get('probe')} result")
            note = ("fitted by kvtier calibrate" if calibrated
                    else f"measured by kvtier probe {body.get('probe')}")
            params = replace(params, **{name: _measured(name, value, calibrated, note)})
    return params


def _measured(name: str, value, calibrated: bool, note: str) -> Param:
    """One measured parameter; ``ValueError`` naming ``name`` unless a finite number > 0."""
    if not _finite_positive(value):
        raise ValueError(f"cost parameter {name} must be a finite number > 0, got {value!r}")
    return Param(float(value), "calibrated" if calibrated else "measured", note)


def _probe_body(result) -> dict:
    if isinstance(result, (str, Path)):
        return json.loads(Path(result).read_text())
    if isinstance(result, dict):
        return result
    return result.to_dict()
