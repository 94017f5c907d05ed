"""What-if: replay a trace against one tier stack and price it with a latency model."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.collector.request_tokens import RequestTokens
from kvtier.policy.cost import CostParams, TtftEstimate, ttft_summary
from kvtier.policy.latency.models import QueueModel, StepModel, requests_for, scaled
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.result import SimResult
from kvtier.policy.sim.simulator import Simulator


@dataclass(frozen=True)
class WhatIf:
    """The cache outcome of a replay and its latency estimate; ``ttft_samples_s`` holds each
    request's TTFT under one draw of the model's noise (so the replays of several instances
    can be summarised together)."""

    result: SimResult
    ttft: TtftEstimate
    ttft_samples_s: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False,
                                       compare=False)

    def to_dict(self) -> dict:
        return {**self.result.to_dict(), **self.ttft.to_dict()}


def what_if(records: Iterable[RequestRecord], config: SimConfig, model=None,
            time_scale: float = 1.0) -> WhatIf:
    """Replay ``records`` against ``config`` and price each request's tier split with
    ``model`` (a :class:`~kvtier.policy.latency.models.LatencyModel`; default: the queue model
    on default costs); ``time_scale`` < 1 compresses inter-arrival times (a load ramp: 0.5
    doubles the request rate). The percentiles are the latency wing's (the median over the
    model's noise draws, ``kvtier.policy.latency.predict``)."""
    from kvtier.policy.latency import predict

    if not (np.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
    model = model or QueueModel(CostParams())
    served: list[tuple[RequestRecord, RequestTokens]] = []
    result = Simulator(config).replay(
        records, on_request=lambda record, outcome: served.append((record, RequestTokens.of(outcome))))
    sources = _sources(model)
    if not served:
        return WhatIf(result, ttft_summary(np.empty(0), 0.0, 0.0, sources), np.empty(0))
    requests = scaled(requests_for(model, [r for r, _ in served], [s for _, s in served]), time_scale)
    samples = predict.draw(model, requests)
    levels = predict.levels(samples, np.random.default_rng(0), metrics=predict.TTFT_METRICS)
    first = samples.ttft_s[0]
    mean_service, utilisation = _load(model, requests)
    ttft = TtftEstimate(len(first), *(lv.predicted for lv in levels), float(first.mean()),
                        mean_service, utilisation, sources)
    return WhatIf(result, ttft, first)


def _load(model, requests) -> tuple[float, float]:
    """Mean service seconds and utilisation, for the queue model (NaN for others: their
    servers are steps, not a queue)."""
    if not isinstance(model, QueueModel):
        return float("nan"), float("nan")
    services = model.service_s(requests)
    span = max(float(requests.arrival_s.max() - requests.arrival_s.min()), 1e-9)
    return float(services.mean()), float(services.sum() / (span * model.servers))


def _sources(model) -> dict:
    if isinstance(model, StepModel):
        return {"engine_model": "calibrated"}
    return model.params.sources()
