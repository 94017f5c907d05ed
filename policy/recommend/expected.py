"""Expected change between two replays of the same requests, as the engine will measure it.

The evaluation period's requests (later time) are replayed under both tier configurations
by the tier replay; the tokens each outcome serves are totals over the period, and TTFT is
the latency model's prediction of the period's percentiles (:mod:`kvtier.policy.latency`:
the model's own arrivals, its noise draws, the evaluated requests resampled, the change
paired on the same resampled requests). Intervals are 5th-95th percentiles. Without a
latency model (``model`` ``None``: nothing fitted could be trusted) only the tokens are
promised.
"""

from __future__ import annotations

import numpy as np

from kvtier.policy.latency import predict
from kvtier.policy.latency.models import requests_for
from kvtier.policy.learn.replay import Replayed
from kvtier.policy.recommend.values import Change

TOKEN_METRICS = ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens",
                 "recompute_tokens")
TTFT_METRICS = tuple(name for name, _ in predict.TTFT_METRICS)


def expected_changes(baseline: Replayed, candidate: Replayed, model, rng: np.random.Generator,
                     *, resamples: int = predict.RESAMPLES, draws: int = predict.DRAWS
                     ) -> tuple[Change, ...]:
    """Tokens per outcome and (with ``model``, a latency model) TTFT p50/p95/p99, each
    baseline -> candidate over the evaluated requests, with intervals."""
    if len(baseline.requests) != len(candidate.requests) or not baseline.requests:
        raise ValueError(f"a change compares the same requests: {len(baseline.requests)} under "
                         f"the baseline, {len(candidate.requests)} under the candidate")
    picks = rng.integers(0, len(baseline.requests), size=(resamples, len(baseline.requests)))
    out = [_tokens(metric, baseline, candidate, picks) for metric in TOKEN_METRICS]
    if model is None:
        return tuple(out)
    samples = [predict.draw(model, requests_for(model, replayed.requests, replayed.outcomes),
                            draws=draws) for replayed in (baseline, candidate)]
    for paired in predict.paired(*samples, rng, resamples=resamples):
        base, cand, change = paired.baseline, paired.candidate, paired.change
        out.append(Change(change.metric, base.predicted, cand.predicted, change.predicted,
                          change.low, change.high, base.low, base.high, cand.low, cand.high))
    return tuple(out)


def _tokens(metric: str, baseline: Replayed, candidate: Replayed, picks: np.ndarray) -> Change:
    """Total tokens of one outcome over the period, and the change's interval over the
    resampled requests (paired)."""
    a = np.array([getattr(o, metric) for o in baseline.outcomes], dtype=float)
    b = np.array([getattr(o, metric) for o in candidate.outcomes], dtype=float)
    diffs = (b - a)[picks].sum(axis=1)
    low, high = np.percentile(diffs, predict.INTERVAL)
    change = float(b.sum() - a.sum())
    return Change(metric, float(a.sum()), float(b.sum()), change, float(min(low, change)),
                  float(max(high, change)))
