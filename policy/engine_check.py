"""The simulator against an engine: replay the requests an engine served (as its probe
recorded them) with the engine's capacities and semantics, and compare, request by request,
the predicted tier split with the measured one; then price the predicted split with a cost
model and compare TTFT percentiles with the measured ones.

The simulator is used as it is (``policy/sim``): requests in arrival order, one at a time.
An engine that served requests concurrently, or whose semantics differ from the simulator's
(vLLM's partial and decode blocks take GPU blocks the simulator does not model), shows up
here as a difference; the report says how large.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.collector.request_tokens import RequestTokens
from kvtier.policy.cost import CostParams
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.simulator import RequestOutcome, iter_outcomes

TIERS = ("gpu", "cpu", "cold", "recompute")


@dataclass(frozen=True)
class RequestDiff:
    """One request whose predicted split differs: tokens per tier, measured and predicted."""

    request_id: str
    measured: RequestTokens
    predicted: RequestTokens


@dataclass(frozen=True)
class TierSplitCheck:
    """Token shares per tier (of all prompt tokens), measured and predicted, in ``TIERS``
    order; how many requests the simulator predicted exactly, and the first that differ."""

    requests: int
    exact_requests: int
    measured_share: tuple[float, ...]
    predicted_share: tuple[float, ...]
    differing: tuple[RequestDiff, ...]

    @property
    def max_share_diff_points(self) -> float:
        """The largest difference of one tier's token share, in percentage points."""
        return 100 * max(abs(m - p) for m, p in zip(self.measured_share, self.predicted_share))

    def to_dict(self) -> dict:
        return {"requests": self.requests, "exact_requests": self.exact_requests,
                "measured_share": dict(zip(TIERS, self.measured_share)),
                "predicted_share": dict(zip(TIERS, self.predicted_share)),
                "max_share_diff_points": self.max_share_diff_points,
                "first_differing": [{"request_id": d.request_id,
                                     "measured": dict(zip(TIERS, d.measured.counts())),
                                     "predicted": dict(zip(TIERS, d.predicted.counts()))}
                                    for d in self.differing[:10]]}


@dataclass(frozen=True)
class TtftCheck:
    """TTFT percentiles measured and predicted (cost model over the predicted split)."""

    requests: int
    measured_p50_s: float
    measured_p95_s: float
    predicted_p50_s: float
    predicted_p95_s: float

    @property
    def error_p50(self) -> float:
        return abs(self.predicted_p50_s - self.measured_p50_s) / self.measured_p50_s

    @property
    def error_p95(self) -> float:
        return abs(self.predicted_p95_s - self.measured_p95_s) / self.measured_p95_s

    def to_dict(self) -> dict:
        return {"requests": self.requests, "measured_p50_s": self.measured_p50_s,
                "measured_p95_s": self.measured_p95_s, "predicted_p50_s": self.predicted_p50_s,
                "predicted_p95_s": self.predicted_p95_s, "error_p50": self.error_p50,
                "error_p95": self.error_p95}


def replay(records: Sequence[RequestRecord], config: SimConfig
           ) -> list[tuple[RequestRecord, RequestOutcome]]:
    """Each measured record with the simulator's outcome for it, in arrival order."""
    return list(iter_outcomes(sorted(records, key=lambda r: r.arrival_s), config))


def check_tier_split(pairs: Sequence[tuple[RequestRecord, RequestOutcome]]) -> TierSplitCheck:
    """Compare measured and predicted splits (``pairs`` from :func:`replay`)."""
    if not pairs:
        raise ValueError("no requests to compare: the store has no engine records with a tier split")
    measured = np.array([RequestTokens.measured(r).counts() for r, _ in pairs], dtype=float)
    predicted = np.array([RequestTokens.of(o).counts() for _, o in pairs], dtype=float)
    prompt = max(float(sum(r.prompt_tokens for r, _ in pairs)), 1.0)
    same = (measured == predicted).all(axis=1)
    differing = tuple(RequestDiff(r.request_id, RequestTokens.measured(r), RequestTokens.of(o))
                      for (r, o), ok in zip(pairs, same) if not ok)
    return TierSplitCheck(len(pairs), int(same.sum()), tuple(measured.sum(axis=0) / prompt),
                          tuple(predicted.sum(axis=0) / prompt), differing)


def check_ttft(pairs: Sequence[tuple[RequestRecord, RequestOutcome]], params: CostParams,
               servers: int = 1) -> TtftCheck:
    """Measured TTFT percentiles against the cost model's over the predicted split (the
    queue model with ``servers`` prefill servers, at the recorded arrival times), over the
    requests that ran alone (``kvtier.policy.calibrate.ran_alone``: a concurrent request's TTFT holds
    the engine's batching, which the queue model does not describe)."""
    from kvtier.policy.calibrate import ran_alone

    alone = ran_alone([r for r, _ in pairs])
    timed = [(r, o) for (r, o), ok in zip(pairs, alone) if ok and r.ttft_s is not None]
    if not timed:
        raise ValueError("no request that ran alone with a measured TTFT to compare")
    from kvtier.policy.latency import predict
    from kvtier.policy.latency.models import QueueModel, requests_for

    model = QueueModel(params, servers)  # through the latency wing's one prediction function
    samples = predict.draw(model, requests_for(model, [r for r, _ in timed],
                                               [RequestTokens.of(o) for _, o in timed]))
    p50, p95, _ = predict.levels(samples, np.random.default_rng(0))
    measured = np.percentile([r.ttft_s for r, _ in timed], [50, 95])
    return TtftCheck(len(timed), float(measured[0]), float(measured[1]), p50.predicted, p95.predicted)
