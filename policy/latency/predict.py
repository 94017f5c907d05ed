"""The one prediction function: TTFT percentiles of a period, as the engine measures them,
with an interval that holds the host's noise and the spread of the requests judged.

The statistic is the engine's own: each percentile (p50, p95, p99) of TTFT over the
*evaluated* requests of the period (``evaluate_from`` on, in arrival order; the requests
before them warm the tiers and are replayed, not counted). The model replays every request
once per noise draw (:data:`DRAWS`; one replay for a model without noise); the point is the
median over draws. The interval is the 5th-95th percentile of the statistic over
:data:`RESAMPLES` resamples, each one draw crossed with the evaluated requests resampled with
replacement: a promise is judged on a later set of requests of the same traffic, whose
percentiles move with which requests they are, and on a host whose stalls move them again.

A change (a candidate tier configuration against a baseline, the same requests under each)
is paired: both sides take the same resampled requests and the same draw (common random
numbers: the same seed's noise and the same draw of the model's own error, which scales both
alike), so what the two configurations share cancels and the change's interval holds what
differs between them. ``rng`` is injected.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtier.policy.engine_model.step_replay import EngineRequests

DRAWS = 20
RESAMPLES = 400
INTERVAL = (5.0, 95.0)
TTFT_METRICS = (("ttft_p50_s", 50.0), ("ttft_p95_s", 95.0), ("ttft_p99_s", 99.0))
STATISTIC = "percentile over the evaluated requests of the period"


@dataclass(frozen=True)
class Level:
    """One statistic predicted: the point (median over draws) and its interval."""

    metric: str
    predicted: float
    low: float
    high: float

    def holds(self, measured: float) -> bool:
        return self.low <= measured <= self.high


@dataclass(frozen=True)
class Samples:
    """Each request's TTFT under each draw (``ttft_s[draw, request]``, arrival order) and the
    first request counted."""

    ttft_s: np.ndarray
    evaluate_from: int = 0

    def __post_init__(self) -> None:
        if self.ttft_s.ndim != 2 or self.ttft_s.shape[0] < 1:
            raise ValueError(f"ttft_s must be (draws, requests), got shape {self.ttft_s.shape}")
        if not 0 <= self.evaluate_from < self.ttft_s.shape[1]:
            raise ValueError(f"evaluate_from must be in [0, {self.ttft_s.shape[1]}), "
                             f"got {self.evaluate_from!r}")

    @property
    def draws(self) -> int:
        return self.ttft_s.shape[0]

    @property
    def evaluated(self) -> np.ndarray:
        return self.ttft_s[:, self.evaluate_from:]


def draw(model, requests: EngineRequests, *, draws: int = DRAWS, evaluate_from: int = 0) -> Samples:
    """``model`` (a :class:`~kvtier.policy.latency.models.LatencyModel`) replayed on
    ``requests`` under ``draws`` noise draws (seeds 0, 1, ...; once when it has none)."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws!r}")
    if len(requests) == 0:
        raise ValueError("no requests to predict")
    runs = [model.ttft_s(requests, np.random.default_rng(seed))
            for seed in range(draws if model.noisy else 1)]
    return Samples(np.vstack(runs), evaluate_from)


def levels(samples: Samples, rng: np.random.Generator, *, resamples: int = RESAMPLES,
           metrics=TTFT_METRICS) -> tuple[Level, ...]:
    """Each of ``metrics`` ((name, percentile) pairs) over ``samples``'s evaluated requests."""
    picks, chosen = _resampling(samples, rng, resamples)
    out = []
    for name, q in metrics:
        point = float(np.median(np.percentile(samples.evaluated, q, axis=1)))
        spread = _percentile_rows(samples.evaluated[chosen[:, 0]], picks, q)
        low, high = np.percentile(spread, INTERVAL)
        out.append(Level(name, point, float(min(low, point)), float(max(high, point))))
    return tuple(out)


@dataclass(frozen=True)
class PairedLevels:
    """Baseline, candidate and the change (candidate less baseline) of one statistic."""

    baseline: Level
    candidate: Level
    change: Level


def paired(baseline: Samples, candidate: Samples, rng: np.random.Generator, *,
           resamples: int = RESAMPLES, metrics=TTFT_METRICS) -> tuple[PairedLevels, ...]:
    """``metrics`` under both, and their change, on the same resampled requests."""
    if baseline.evaluated.shape[1] != candidate.evaluated.shape[1]:
        raise ValueError(f"a change compares the same requests: {baseline.evaluated.shape[1]} "
                         f"evaluated under the baseline, {candidate.evaluated.shape[1]} under the candidate")
    if baseline.draws != candidate.draws:
        raise ValueError(f"a change pairs draws: {baseline.draws} under the baseline, "
                         f"{candidate.draws} under the candidate")
    picks, chosen = _resampling(baseline, rng, resamples)
    other = chosen[:, 0]  # the same draw on both sides
    out = []
    for name, q in metrics:
        base_rows = _percentile_rows(baseline.evaluated[chosen[:, 0]], picks, q)
        cand_rows = _percentile_rows(candidate.evaluated[other], picks, q)
        base_point = float(np.median(np.percentile(baseline.evaluated, q, axis=1)))
        cand_point = float(np.median(np.percentile(candidate.evaluated, q, axis=1)))
        out.append(PairedLevels(_level(name, base_point, base_rows), _level(name, cand_point, cand_rows),
                                _level(name, cand_point - base_point, cand_rows - base_rows)))
    return tuple(out)


def _level(name: str, point: float, spread: np.ndarray) -> Level:
    low, high = np.percentile(spread, INTERVAL)
    return Level(name, point, float(min(low, point)), float(max(high, point)))


def _resampling(samples: Samples, rng: np.random.Generator, resamples: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(resampled request indices per resample, the draw each resample takes)."""
    if resamples < 10:
        raise ValueError(f"resamples must be >= 10, got {resamples!r}")
    n = samples.evaluated.shape[1]
    picks = rng.integers(0, n, size=(resamples, n))
    return picks, rng.integers(0, samples.draws, size=(resamples, 1))


def _percentile_rows(rows: np.ndarray, picks: np.ndarray, q: float) -> np.ndarray:
    """Per resample ``b``: the ``q``-th percentile of ``rows[b, picks[b]]``."""
    return np.percentile(np.take_along_axis(rows, picks, axis=1), q, axis=1)
