"""The engine model's parameters fitted to what an engine recorded.

* **From step records** (an engine probe that records each scheduler step): the step cost's
  coefficients by non-negative least squares of ``duration_s`` over the step's features
  (``step_cost.FEATURES``); columns are scaled to unit norm first, so a coefficient in
  seconds per token and one in seconds per step weigh alike. The squares are reweighted
  into least absolute deviations: on a loaded host a few steps take several times the
  median, a least-squares fit follows them up, and the replay's queue then amplifies the
  excess (the reference engine at concurrency 4, 80 requests, in sample: TTFT p50 6.7x
  over with least squares, 1.3x with the median fit). The slow steps come back as the
  noise: quantiles of measured less fitted duration, added per step by the replay, so a
  request's mean ITL and the queue's tail see them. Added seconds, not a factor: a host's
  interruptions cost about the same whatever the step (as a factor, on 6 reference-engine
  stores at concurrency 1 and 4, the held-out mean |log(predicted/measured)| over TTFT
  p50/p95/p99 and ITL p50/p99 was 0.55; added, 0.44; without noise, 0.97). The steps that
  prefill keep their own noise: their spread is several times a decode step's (drawn for
  every step it lengthened the decode steps a request arriving under concurrency waits
  behind: the reference engine at concurrency 4, TTFT p50 1.4-1.6x over with one pool).
  Added in full whatever the prefill's size: scaled down for prefills cheaper than the median
  one, the demo's CPU-tier TTFT p50 came out 0.06-0.08 lower on five of five stores and no
  other percentile better; as a factor, one host stall of 10x a small step, applied as 10x
  to a large one, put a TTFT p99 2.4x over. Each kind of step (prefill only, decode only,
  both) weighs alike in the fit, so the few steps that prefill alone still say how much of a
  decoding step is the decode pass and how much the overhead every step pays.
* **From request records alone** (an older store, a public trace with latencies): the
  coefficients that make the engine model's replay of the requests match their measured
  TTFT quantiles (10th to 99th percentile) and ITL quantiles (10th to 90th: a loaded host's
  stalls sit above) as squared log ratios, by a Nelder-Mead search over the logarithms of the overhead per
  step, per prefill token, per prefill request, per prefill token and context token, and
  per decode request, started from a guess read off the medians.
* **Admission delay**: what the engine's frontend takes before any step can hold the request
  (tokenising, the hand-off between processes), which no step record carries: the request
  records' ``handoff_s`` where the probe measures it (vLLM: arrival to the scheduler's
  ``add_request``), else the seconds from arrival to the next step's start over the requests
  that arrived alone while the engine idled. vLLM on this host, concurrency 1: 3.0 ms median,
  6.3 ms at the 90th percentile, a sixth of a 19 ms TTFT.
* **Batching limits**: the most running requests a step record shows, else what the caller
  gives, else the most requests ever in flight together.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvtier.collector.events import RequestRecord, StepRecord
from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits
from kvtier.policy.engine_model.closed_loop import arrivals_of, engine_requests
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.engine_model.step_cost import FEATURES, StepCost, step_durations, step_features
from kvtier.policy.engine_model.step_replay import replay

TTFT_QUANTILES = (10, 25, 50, 75, 90, 95, 99)
ITL_QUANTILES = (10, 50, 90)
SEARCHED = ("overhead_s", "prefill_token_s", "prefill_request_s", "attention_s", "decode_request_s")
MIN_STEPS = 8
ROBUST_ITERATIONS = 30
ROBUST_FLOOR_S = 1e-6
NOISE_QUANTILES = 41
MIN_REQUESTS = 8


def fit_step_cost(steps: Sequence[StepRecord]) -> StepCost:
    """Non-negative least squares of the steps' durations over their features;
    ``ValueError`` with fewer than :data:`MIN_STEPS` timed steps."""
    from scipy.optimize import nnls

    features, durations = step_features(steps), step_durations(steps)
    timed = ~np.isnan(durations)
    if timed.sum() < MIN_STEPS:
        raise ValueError(f"{int(timed.sum())} timed step records; the fit needs >= {MIN_STEPS}")
    x, y = features[timed], durations[timed]
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    x = x / scale
    kinds = _kind_weights(features[timed])
    weights = np.sqrt(kinds)
    for _ in range(ROBUST_ITERATIONS):  # least absolute deviations by reweighting
        solution, _ = nnls(x * weights[:, None], y * weights)
        weights = np.sqrt(kinds / np.maximum(np.abs(y - x @ solution), ROBUST_FLOOR_S))
    return StepCost.from_coefficients(solution / scale)


RESAMPLED_FITS = 8


def resampled_step_costs(steps: Sequence[StepRecord], fits: int = RESAMPLED_FITS,
                         seed: int = 0) -> tuple[StepCost, ...]:
    """The step cost refitted on ``fits`` resamples of the steps (with replacement): how far
    each coefficient could move on this many observations. A replay draws one per run, so a
    cost resting on few steps (a handful that loaded promoted KV) widens the prediction's
    interval by as much as it is uncertain; thousands of steps move it little."""
    rng = np.random.default_rng(seed)
    steps = list(steps)
    out = []
    for _ in range(fits):
        picked = [steps[i] for i in rng.integers(0, len(steps), len(steps))]
        try:
            out.append(fit_step_cost(picked))
        except ValueError:  # a resample with too few timed steps
            continue
    return tuple(out)


def _kind_weights(features: np.ndarray) -> np.ndarray:
    """Per step, a weight that gives each kind of step (prefill only, decode only, both)
    the same say in the fit. Only the few steps that prefill with nothing to decode tell the
    step overhead from the decode pass; counted one by one, under concurrency the
    hundreds of decoding steps outvote them and the fit folds the decode pass into the
    overhead (the reference engine at concurrency 4: 3.7 ms of decode pass charged before
    every first token, TTFT p50 1.4x over)."""
    column = {name: features[:, i] for i, name in enumerate(FEATURES)}
    kind = (column["prefill_requests"] > 0).astype(int) + 2 * (column["decode_passes"] > 0)
    counts = np.bincount(kind, minlength=4)
    return len(kind) / (np.count_nonzero(counts) * counts[kind])


def fit_step_noise_s(steps: Sequence[StepRecord], cost: StepCost,
                     prefill: bool | None = None) -> tuple[float, ...]:
    """Quantiles (:data:`NOISE_QUANTILES` of them) of the timed steps' measured duration
    less ``cost``'s prediction, in seconds: what ``EngineModelParams.step_noise_s`` holds;
    with ``prefill`` True or False, over the steps that prefill or that only decode."""
    features = step_features(steps)
    predicted, durations = cost.seconds(features), step_durations(steps)
    usable = ~np.isnan(durations) & (predicted > 0)
    if prefill is not None:
        usable &= (features[:, FEATURES.index("prefill_requests")] > 0) == prefill
    if usable.sum() < MIN_STEPS:
        return ()
    excess = durations[usable] - predicted[usable]
    return tuple(float(v) for v in np.quantile(excess, np.linspace(0, 1, NOISE_QUANTILES)))


NOISE_RANGES = 3


def fit_prefill_noise_by_work(steps: Sequence[StepRecord], cost: StepCost,
                              ranges: int = NOISE_RANGES) -> tuple[tuple[float, tuple[float, ...]], ...]:
    """The prefill steps' noise (as :func:`fit_step_noise_s`) apart for ``ranges`` ranges of
    the work ``cost`` predicts for them, each holding as many steps: what
    ``EngineModelParams.prefill_noise_by_work`` holds. A host's stalls and the fit's own
    misses grow with a step's work: on the demo's GPU-only phase the 90th percentile of the
    residual was 1.8 ms for steps predicted under 5 ms and 12 ms for those of 21-63 ms, and
    one distribution for all gave a CPU tier's short prefills the long steps' tail (TTFT p50
    predicted 1.35x the measured; 1.21x drawn by range). Empty when a range would hold fewer
    than 2 * :data:`MIN_STEPS` steps."""
    features = step_features(steps)
    predicted, durations = cost.seconds(features), step_durations(steps)
    usable = ~np.isnan(durations) & (predicted > 0) & (features[:, FEATURES.index("prefill_requests")] > 0)
    if ranges < 2 or usable.sum() < ranges * 2 * MIN_STEPS:
        return ()
    work, excess = predicted[usable], durations[usable] - predicted[usable]
    order = np.argsort(work, kind="stable")
    out = []
    for part in np.array_split(order, ranges):
        quantiles = np.quantile(excess[part], np.linspace(0, 1, NOISE_QUANTILES))
        out.append((float(work[part].max()), tuple(float(v) for v in quantiles)))
    return tuple(out)


def fit_admission_delay_s(records: Sequence[RequestRecord],
                          steps: Sequence[StepRecord]) -> tuple[float, ...]:
    """Quantiles (:data:`NOISE_QUANTILES`) of the seconds from a request's arrival until the
    engine could schedule it: the records' ``handoff_s`` where the probe measured it (every
    request, at any load), else the time to the next step's start over the requests that
    arrived while the engine idled (after the last timed step before them had ended, and
    after any earlier request had been taken up); what
    ``EngineModelParams.admission_delay_s`` holds. Empty with fewer than
    :data:`MIN_REQUESTS` of either."""
    timed = sorted((s.time_s, s.duration_s) for s in steps if s.duration_s is not None)
    starts = np.array([t for t, _ in timed], dtype=float)
    ends = np.maximum.accumulate(starts + np.array([d for _, d in timed], dtype=float))
    handed = [(r.arrival_s, r.handoff_s) for r in records if r.handoff_s is not None]
    if len(handed) >= MIN_REQUESTS:
        return _quantiles(_frontend_s(np.array(handed, dtype=float), starts, ends))
    if not timed:
        return ()
    arrivals = np.sort(np.array([r.arrival_s for r in records], dtype=float))
    following = np.searchsorted(starts, arrivals)
    previous = np.clip(following - 1, 0, None)
    earlier = np.append(-np.inf, arrivals[:-1])
    idle = (following > 0) & (following < len(starts)) & (ends[previous] <= arrivals) \
        & (earlier < ends[previous])  # alone: no other request waited in the same idle gap
    if idle.sum() < MIN_REQUESTS:
        return ()
    return _quantiles(starts[following[idle]] - arrivals[idle])


def _frontend_s(handed: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The frontend's share of each (arrival, hand-off): an engine takes requests in between
    steps, so a hand-off that ended while a step ran holds the rest of that step, which the
    replay's own step makes the request wait for again. The request reached the engine after
    that step began (or on arrival, if it began before) and before the hand-off ended; with
    nothing to tell where in between, the middle. A hand-off that ended at an idle engine (or
    with no step recorded) is the frontend's alone."""
    arrivals, handoffs = handed[:, 0], handed[:, 1]
    if not len(starts):
        return handoffs
    at = np.searchsorted(starts, arrivals + handoffs, side="right") - 1  # the step before
    ran = (at >= 0) & (ends[np.clip(at, 0, None)] > arrivals)
    earliest = np.clip(starts[np.clip(at, 0, None)] - arrivals, 0.0, handoffs)
    return np.where(ran, (earliest + handoffs) / 2, handoffs)


def _quantiles(values: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in np.quantile(values, np.linspace(0, 1, NOISE_QUANTILES)))


def fit_step_cost_to_requests(records: Sequence[RequestRecord], base: EngineModelParams,
                              *, evaluations: int = 160, arrivals: str = "auto") -> StepCost:
    """The step cost whose replay of ``records`` (recorded arrivals and tier splits, the
    limits and links of ``base``) best matches their measured TTFT and ITL quantiles."""
    from dataclasses import replace

    from scipy.optimize import minimize

    timed = [r for r in records if r.ttft_s is not None]
    if len(timed) < MIN_REQUESTS:
        raise ValueError(f"{len(timed)} requests with a measured TTFT; the fit needs >= {MIN_REQUESTS}")
    requests = engine_requests(sorted(timed, key=lambda r: r.arrival_s), arrivals)
    timed = sorted(timed, key=lambda r: r.arrival_s)
    ttft_q = np.percentile([r.ttft_s for r in timed], TTFT_QUANTILES)
    itl = np.array([r.itl_s for r in timed if r.itl_s is not None], dtype=float)
    itl_q = np.percentile(itl, ITL_QUANTILES) if len(itl) else None

    def cost_of(log_values) -> StepCost:
        return StepCost(**dict(zip(SEARCHED, np.exp(log_values))))

    def loss(log_values) -> float:
        result = replay(requests, replace(base, step_cost=cost_of(log_values)))
        error = _log_ratio(np.percentile(result.ttft_s, TTFT_QUANTILES), ttft_q)
        if itl_q is not None and np.isfinite(result.itl_s).any():
            error = np.append(error, _log_ratio(np.nanpercentile(result.itl_s, ITL_QUANTILES), itl_q))
        return float(np.sum(error ** 2))

    start = np.log(_first_guess(timed, itl))
    best = minimize(loss, start, method="Nelder-Mead",
                    options={"maxfev": evaluations, "xatol": 0.05, "fatol": 1e-4})
    return cost_of(best.x)


def _first_guess(records: Sequence[RequestRecord], itl: np.ndarray) -> np.ndarray:
    """Each of :data:`SEARCHED`, from medians."""
    ttft = float(np.median([r.ttft_s for r in records]))
    step_s = float(np.median(itl)) if len(itl) else ttft / 2
    recompute = max(float(np.median([max(r.recomputed_tokens or r.prompt_tokens, 1)
                                     for r in records])), 1.0)
    per_token = max(ttft - step_s, step_s * 0.1) / recompute
    return np.array([step_s / 2, per_token, step_s / 4, per_token / 4096, step_s / 8])


def _log_ratio(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    floor = 1e-6
    return np.log(np.maximum(predicted, floor)) - np.log(np.maximum(measured, floor))


def fit_limits(records: Sequence[RequestRecord], steps: Sequence[StepRecord] = (), *,
               max_running: int | None = None, token_budget: int | None = None,
               chunked_prefill: bool = False, first_token: str = "step_end",
               kv_blocks: int | None = None, promotions: str = "queued") -> SchedulerLimits:
    """Batching limits: ``max_running`` as given, else the most running requests a step
    record shows, else the most requests in flight together in ``records``; ``kv_blocks``
    (the GPU's KV capacity) in the records' block size."""
    if max_running is None:
        seen = max((s.running_requests for s in steps), default=0)
        max_running = seen or max_in_flight(records)
    block_tokens = next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
    return SchedulerLimits(max(int(max_running), 1), token_budget, chunked_prefill, first_token,
                           kv_blocks, int(block_tokens), promotions)


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    """The most requests between their arrival and their end at once (1 without ends)."""
    ends = [(r.arrival_s, r.arrival_s + r.e2e_latency_s) for r in records if r.e2e_latency_s is not None]
    if not ends:
        return 1
    points = sorted([(a, 1) for a, _ in ends] + [(e, -1) for _, e in ends])
    return max(1, int(np.max(np.cumsum([d for _, d in points]))))


def fit_engine(records: Sequence[RequestRecord], steps: Sequence[StepRecord], jobs, *,
               bytes_per_token: int | None = None, limits: SchedulerLimits | None = None,
               evaluations: int = 160, arrivals: str = "auto") -> EngineModelParams:
    """Every engine-model parameter from one engine's records: promotion links from its
    promotion jobs (``kvtier.policy.calibrate.fit_promotions``; defaults where it has none),
    limits (:func:`fit_limits` unless given), the step cost from ``steps`` when there are
    enough, else from ``records`` by search."""
    from kvtier.policy.calibrate import fit_promotions
    from kvtier.policy.cost import CostParams
    from kvtier.policy.engine_model.transfers import TransferLink
    from kvtier.policy.geometry import geometry_for

    cost = CostParams() if bytes_per_token is None else CostParams(model=geometry_for(bytes_per_token))
    cost, _ = fit_promotions(jobs, cost)
    base = EngineModelParams(
        limits=limits or fit_limits(records, steps),
        cpu_link=TransferLink(cost.cpu_gpu_bandwidth_bytes_per_s.value, cost.cpu_gpu_op_latency_s.value),
        cold_link=TransferLink(cost.cold_cpu_bandwidth_bytes_per_s.value, cost.cold_cpu_op_latency_s.value),
        kv_bytes_per_token=int(cost.model.bytes_per_token),
        arrivals=arrivals_of(sorted(records, key=lambda r: r.arrival_s), arrivals))
    from dataclasses import replace

    timed_steps = int((~np.isnan(step_durations(steps))).sum()) if steps else 0
    if timed_steps >= MIN_STEPS:
        cost = fit_step_cost(steps)
        return replace(base, step_cost=cost, fitted_from="step_records",
                       step_cost_draws=resampled_step_costs(steps),
                       step_noise_s=fit_step_noise_s(steps, cost, prefill=False) or
                       fit_step_noise_s(steps, cost),
                       prefill_step_noise_s=fit_step_noise_s(steps, cost, prefill=True),
                       prefill_noise_by_work=fit_prefill_noise_by_work(steps, cost),
                       admission_delay_s=fit_admission_delay_s(records, steps))
    cost = fit_step_cost_to_requests(records, base, evaluations=evaluations, arrivals=arrivals)
    return replace(base, step_cost=cost, fitted_from="request_search")
