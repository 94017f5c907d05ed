"""What-if: replay a trace against one tier stack and price it with the cost model."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.collector.request_tokens import RequestTokens
from kvtier.policy.cost import CostParams, TtftEstimate, queue_ttft_samples, ttft_summary
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.result import SimResult
from kvtier.policy.sim.simulator import Simulator


@dataclass(frozen=True)
class WhatIf:
    """The cache outcome of a replay and its latency estimate; ``ttft_samples_s`` holds each
    request's TTFT (so the replays of several instances can be summarised together)."""

    result: SimResult
    ttft: TtftEstimate
    ttft_samples_s: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False,
                                       compare=False)

    def to_dict(self) -> dict:
        return {**self.result.to_dict(), **self.ttft.to_dict()}


def what_if(records: Iterable[RequestRecord], config: SimConfig,
            params: CostParams = CostParams(), time_scale: float = 1.0,
            servers: int = 1, engine=None) -> WhatIf:
    """Replay ``records`` against ``config``; ``time_scale`` < 1 compresses inter-arrival
    times (a load ramp: 0.5 doubles the request rate); ``servers`` prefill in parallel.
    With ``engine`` (the step-level engine model's ``EngineModelParams``) each request's
    TTFT comes from the engine model over the replayed tier split instead of the queue."""
    if not (np.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
    arrivals, services, served = [], [], []

    def price(record: RequestRecord, outcome) -> None:
        arrivals.append(record.arrival_s * time_scale)
        services.append(params.service_s(outcome.cpu_promotion_tokens,
                                         outcome.cold_promotion_tokens,
                                         outcome.recompute_tokens))
        if engine is not None:
            served.append((record, RequestTokens.of(outcome)))

    result = Simulator(config).replay(records, on_request=price)
    if engine is not None:
        samples = _engine_ttft(served, np.asarray(arrivals, dtype=float), engine)
    else:
        samples = queue_ttft_samples(arrivals, services, servers)
    if not arrivals:
        return WhatIf(result, ttft_summary(samples, 0.0, 0.0, params.sources()), samples)
    span = max(arrivals[-1] - arrivals[0], 1e-9)
    sources = params.sources() | ({"engine_model": "calibrated"} if engine is not None else {})
    ttft = ttft_summary(samples, float(np.mean(services)), float(np.sum(services) / (span * servers)),
                        sources)
    return WhatIf(result, ttft, samples)


def _engine_ttft(served, arrivals_s: np.ndarray, engine) -> np.ndarray:
    """Each request's TTFT through the engine model, at the (scaled) arrivals."""
    from dataclasses import replace

    from kvtier.policy.engine_model.step_replay import EngineRequests, replay

    if not served:
        return np.empty(0)
    requests = EngineRequests.from_records([r for r, _ in served], [s for _, s in served])
    return replay(replace(requests, arrival_s=arrivals_s), engine).ttft_s
