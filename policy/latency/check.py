"""A latency model against an engine: fitted on the earlier part of what it recorded,
replayed on the later part, one tier configuration at a time, TTFT and ITL percentiles
predicted beside measured, with the prediction's interval (``predict.py``). The
single-server queue model is priced on the same requests beside the engine model.

Requests enter the replay with their recorded tier split, as the model's arrivals say (open
or closed loop): this checks the latency model alone (``engine_check.check_tier_split``
checks the tier replay's split).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvtier.collector.events import RequestRecord, StepRecord
from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.latency import predict
from kvtier.policy.latency.models import QueueModel, StepModel, requests_for

FIELDS = ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")
TTFT_FIELDS = FIELDS[:3]
DRAWS = predict.DRAWS
MIN_REQUESTS = 16  # an inner check of the model's own error needs this many in each half


@dataclass(frozen=True)
class Latencies:
    """Percentiles over a set of requests, in :data:`FIELDS` order (NaN when unknown)."""

    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float

    @classmethod
    def of(cls, ttft_s, itl_s) -> Latencies:
        ttft = np.asarray(ttft_s, dtype=float)
        itl = np.asarray(itl_s, dtype=float)
        itl = itl[np.isfinite(itl)]
        t = np.percentile(ttft, [50, 95, 99]) if len(ttft) else [np.nan] * 3
        i = np.percentile(itl, [50, 99]) if len(itl) else [np.nan] * 2
        return cls(*(float(v) for v in (*t, *i)))

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in FIELDS}

    def ratios(self, measured: Latencies) -> dict[str, float]:
        """This over ``measured``, field by field (NaN where either is unknown or 0)."""
        out = {}
        for name in FIELDS:
            num, den = getattr(self, name), getattr(measured, name)
            out[name] = num / den if np.isfinite(num) and np.isfinite(den) and den > 0 else float("nan")
        return out


@dataclass(frozen=True)
class LatencyCheck:
    """One tier configuration's later requests: measured, the engine model's prediction (with
    the TTFT intervals) and the single-server model's (TTFT only; ``None`` when it could not be
    fitted)."""

    tier_config_id: str
    requests: int
    measured: Latencies
    predicted: Latencies
    single_server: Latencies | None
    closed_loop: bool = False  # replayed as closed-loop clients (closed_loop.py)
    intervals: tuple[predict.Level, ...] = ()

    def inside(self) -> dict[str, bool]:
        """Whether each measured TTFT percentile fell inside its predicted interval."""
        return {level.metric: level.holds(getattr(self.measured, level.metric))
                for level in self.intervals}

    def to_dict(self) -> dict:
        single = self.single_server
        return {"tier_config_id": self.tier_config_id, "requests": self.requests,
                "closed_loop": self.closed_loop, "measured": self.measured.to_dict(),
                "predicted": self.predicted.to_dict(), "ratio": self.predicted.ratios(self.measured),
                "interval": {lv.metric: [lv.low, lv.high] for lv in self.intervals},
                "inside": self.inside(),
                "single_server": single.to_dict() if single else None,
                "single_server_ratio": single.ratios(self.measured) if single else None}


@dataclass(frozen=True)
class HeldOutCheck:
    """Parameters fitted on requests that arrived before ``split_s``; checks after it."""

    params: EngineModelParams
    split_s: float
    fit_requests: int
    checks: tuple[LatencyCheck, ...]
    single_server_note: str = ""

    def to_dict(self) -> dict:
        return {"params": self.params.to_dict(), "split_s": self.split_s,
                "fit_requests": self.fit_requests, "single_server_note": self.single_server_note,
                "by_tier_config": [c.to_dict() for c in self.checks]}


def check_latency(records: Sequence[RequestRecord], params: EngineModelParams,
                  single_server=None) -> tuple[LatencyCheck, ...]:
    """Each tier configuration's requests (in arrival order) replayed through the engine
    model, against what they measured; ``single_server`` (``CostParams``) priced beside."""
    by_config: dict[str, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: r.arrival_s):
        if record.ttft_s is not None:
            by_config.setdefault(record.tier_config_id or "", []).append(record)
    return tuple(_check_one(config, group, params, single_server)
                 for config, group in by_config.items())


def _check_one(config: str, records: list[RequestRecord], params: EngineModelParams,
               single_server) -> LatencyCheck:
    model = StepModel(params)
    requests = requests_for(model, records)
    measured = Latencies.of([r.ttft_s for r in records],
                            [np.nan if r.itl_s is None else r.itl_s for r in records])
    predicted, intervals = predicted_latencies(model, requests)
    return LatencyCheck(config, len(records), measured, predicted,
                        _single_server(records, single_server), requests.follows is not None,
                        intervals)


def predicted_latencies(model: StepModel, requests, draws: int = DRAWS
                        ) -> tuple[Latencies, tuple[predict.Level, ...]]:
    """Each percentile of :data:`FIELDS` as the median over ``draws`` replays under their
    own step-noise draws (one draw decides a p99 over a few dozen requests by the one stall
    it lands: the reference engine at concurrency 1, 80 requests, TTFT p99 predicted at 7.9x
    of measured in one draw), and the TTFT intervals (``predict.levels``)."""
    draws = [model.draw(requests, np.random.default_rng(seed))
             for seed in range(draws if model.noisy else 1)]
    runs = [run for run, _ in draws]
    ttft = predict.Samples(np.vstack([run.ttft_s * factor for run, factor in draws]))
    intervals = predict.levels(ttft, np.random.default_rng(0))
    with np.errstate(all="ignore"):
        itl = [np.median([Latencies.of([], r.itl_s).to_dict()[name] for r in runs])
               for name in FIELDS[3:]]
    return Latencies(*(lv.predicted for lv in intervals), *map(float, itl)), intervals


def _single_server(records: list[RequestRecord], cost) -> Latencies | None:
    if cost is None:
        return None
    model = QueueModel(cost)
    ttft = model.ttft_s(requests_for(model, records), np.random.default_rng(0))
    return Latencies.of(ttft, [])


# The model's error on requests it was not fitted on, before a check says more. The root mean
# square log(predicted/measured) of TTFT p50/p95/p99 over the held-out splits of
# benchmarks/coverage.py (reference engine at concurrency 1 and 4, the demo's phases with the
# GPU's KV capacity known, a serving vLLM with a CPU tier) is 0.21-0.27 on a 2-core host, and
# it already holds the step noise and the requests' sampling spread that a prediction's draws
# add again: on fixed stores (four demo runs, four reference stores, one vLLM: 195 checks) a
# prior of 0.15 / 0.20 / 0.25 held 89% / 93% / 96% of the measurements in their 90% intervals.
# It weighs as much as one check's three percentiles.
PRIOR_LOG_SD, PRIOR_WEIGHT = 0.20, 3


def model_error_log_sd(checks) -> float:
    """How far a model misses on requests it was not fitted on, as the standard deviation of
    log(predicted/measured) over the TTFT percentiles of ``checks`` (``LatencyCheck`` values,
    or their dicts), pooled with :data:`PRIOR_LOG_SD`: a few ratios from one split say little
    alone (one split of a reference-engine store gave 0.14, the next split's miss was 0.9)."""
    logs = []
    for check in checks:
        ratios = check["ratio"] if isinstance(check, dict) else check.predicted.ratios(check.measured)
        logs += [np.log(ratios[m]) for m in TTFT_FIELDS
                 if ratios.get(m) is not None and np.isfinite(ratios[m]) and ratios[m] > 0]
    pooled = PRIOR_WEIGHT * PRIOR_LOG_SD ** 2 + float(np.sum(np.square(logs)))
    return float(np.sqrt(pooled / (PRIOR_WEIGHT + len(logs))))


def held_out_check(records: Sequence[RequestRecord], steps: Sequence[StepRecord], jobs, *,
                   bytes_per_token: int | None = None, limits: SchedulerLimits | None = None,
                   fit_share: float = 0.5, arrivals: str = "auto",
                   inner: bool = True) -> HeldOutCheck:
    """Fit on the earliest ``fit_share`` of ``records`` (and the step records before the
    first later request), check on the rest. The fitted model's own error
    (``model_error_log_sd``) is estimated the same way inside the earlier part alone (its
    first half fitted, its second half checked; with ``inner``), so the check's intervals
    carry what the model could know of its error when it predicted. ``ValueError`` when either
    part is empty."""
    from kvtier.policy.calibrate import calibrate
    from kvtier.policy.engine_model.fit import fit_engine

    if not 0 < fit_share < 1:
        raise ValueError(f"fit_share must be in (0, 1), got {fit_share!r}")
    ordered = sorted(records, key=lambda r: r.arrival_s)
    cut = int(len(ordered) * fit_share)
    if cut == 0 or cut == len(ordered):
        raise ValueError(f"{len(ordered)} requests cannot be split into a fit and a check")
    earlier, later = ordered[:cut], ordered[cut:]
    split_s = later[0].arrival_s
    before = [s for s in steps if s.time_s < split_s]
    params = fit_engine(earlier, before, jobs, bytes_per_token=bytes_per_token, limits=limits,
                        arrivals=arrivals)
    if inner and len(earlier) >= 2 * MIN_REQUESTS:
        try:
            within = held_out_check(earlier, before, jobs, bytes_per_token=bytes_per_token,
                                    limits=limits, arrivals=arrivals, inner=False)
            params = replace(params, model_error_log_sd=model_error_log_sd(within.checks))
        except ValueError:  # too few steps or requests in half of the earlier part
            pass
    try:
        single, note = calibrate(earlier, jobs, bytes_per_token=bytes_per_token).params, ""
    except ValueError as error:
        single, note = None, str(error)
    return HeldOutCheck(params, split_s, len(earlier), check_latency(later, params, single), note)
