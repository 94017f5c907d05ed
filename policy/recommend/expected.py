"""Expected change between two replays of the same requests, with bootstrap uncertainty.

The evaluation period is cut, in time order, into ``windows`` windows of equal request
counts (arrivals tie on coarse clocks, so equal spans could be empty); each is priced on
its own (the FIFO queueing model of :mod:`kvtier.policy.cost`), giving per-window token totals and
TTFT percentiles for the baseline and the candidate. Given the step-level engine model's
parameters (``engine``), TTFT comes from it instead: the whole period replayed once through
batched steps with each request's replayed tier split (so a window starts with the queue the
one before left), then cut into the same windows, once per draw of the model's step noise
(:data:`ENGINE_DRAWS` replays). The change is the mean per-window difference; its interval
is the 5th-95th percentile of that mean over windows resampled with replacement (a paired
bootstrap, ``rng`` injected), each resample also taking one noise draw of each replay, so
the interval holds the host's stall spread as well as the traffic's.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from kvtier.policy.cost import CostParams, queue_ttft
from kvtier.policy.learn.replay import Replayed
from kvtier.policy.recommend.values import Change

TOKEN_METRICS = ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens",
                 "recompute_tokens")
TTFT_METRICS = ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s")
ENGINE_DRAWS = 8  # engine-model replays, each under its own step-noise draws


def expected_changes(baseline: Replayed, candidate: Replayed, params: CostParams,
                     rng: np.random.Generator, *, windows: int = 10, servers: int = 1,
                     resamples: int = 500, engine=None) -> tuple[Change, ...]:
    """Per-window means and bootstrap intervals for tokens per outcome and TTFT (from the
    engine model when ``engine``, its ``EngineModelParams``, is given)."""
    if windows < 2 or resamples < 10:
        raise ValueError(f"windows must be >= 2 and resamples >= 10, got {windows}, {resamples}")
    a = _per_window(baseline, params, windows, servers, engine)  # (draws, windows, metrics)
    b = _per_window(candidate, params, windows, servers, engine)
    picks = rng.integers(0, a.shape[1], size=(resamples, a.shape[1]))
    draw_a = rng.integers(0, len(a), size=(resamples, 1))
    draw_b = rng.integers(0, len(b), size=(resamples, 1))
    out = []
    for column, metric in enumerate((*TOKEN_METRICS, *TTFT_METRICS)):
        diff = b[..., column].mean(axis=0) - a[..., column].mean(axis=0)
        means = (b[draw_b, picks, column] - a[draw_a, picks, column]).mean(axis=1)
        low, high = np.percentile(means, [5, 95])
        out.append(Change(metric, float(a[..., column].mean()), float(b[..., column].mean()),
                          float(diff.mean()), float(low), float(high)))
    return tuple(out)


def _per_window(replayed: Replayed, params: CostParams, windows: int, servers: int,
                engine=None) -> np.ndarray:
    arrivals = np.asarray([r.arrival_s for r in replayed.requests])
    if len(arrivals) < windows:
        raise ValueError(f"need at least {windows} requests for {windows} windows, "
                         f"got {len(arrivals)}")
    # equal-count cuts keep every window non-empty when arrivals tie (3 s ticks in Mooncake)
    bounds = np.linspace(0, len(arrivals), windows + 1).astype(int)
    draws = _engine_ttft(replayed, engine) if engine is not None else [None]
    rows = []
    for engine_ttft in draws:
        for lo, hi in pairwise(bounds.tolist()):
            outcomes = replayed.outcomes[lo:hi]
            tokens = [sum(getattr(o, m) for o in outcomes) for m in TOKEN_METRICS]
            if engine_ttft is not None:
                rows.append([*tokens, *np.percentile(engine_ttft[lo:hi], [50, 95, 99])])
                continue
            services = [params.service_s(o.cpu_promotion_tokens, o.cold_promotion_tokens,
                                         o.recompute_tokens) for o in outcomes]
            ttft = queue_ttft(arrivals[lo:hi], services, servers=servers)
            rows.append([*tokens, ttft.p50_s, ttft.p95_s, ttft.p99_s])
    return np.asarray(rows, dtype=float).reshape(len(draws), windows, -1)


def _engine_ttft(replayed: Replayed, engine) -> list[np.ndarray]:
    """Each request's TTFT through the engine model, with its replayed tier split, once per
    step-noise draw (one replay when the model has no noise)."""
    from kvtier.policy.engine_model.step_replay import EngineRequests, replays

    requests = EngineRequests.from_records(replayed.requests, replayed.outcomes)
    return [run.ttft_s for run in replays(requests, engine, ENGINE_DRAWS)]

