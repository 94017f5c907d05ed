"""The demo's latency prediction: the engine model calibrated on the GPU-only phase, what it
predicts for each tier configuration the rollout then deploys, and the measurement beside it.

The engine model (``kvtier.policy.engine_model``) is fitted on the reference engine's step
records and request records of the act's GPU-only phase, and written as a ``--cost-params``
file for ``kvtier recommend``. For a deployed configuration it replays the GPU-only phase's
requests (closed-loop clients, as the load probe sends them) with the tier split the tier
replay gives at that configuration's sizes (``kvtier.policy.learn.replay``, as the
recommendation replays them), once per draw of the fitted step noise: the prediction is the
median over draws, its interval the 5th-95th percentile. The measurement is the same
requests' TTFT as the engine recorded it (from arrival at the engine to the first token),
the quantity the model is fitted to.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kvtier.collector import json_text
from kvtier.collector.calibration_inputs import calibration_inputs
from kvtier.collector.events import RequestRecord, StepRecord
from kvtier.collector.request_tokens import RequestTokens
from kvtier.collector.store import TraceStore
from kvtier.policy.engine_model.params import SECTION, EngineModelParams

ENGINE = "reference"  # the demo's engine; its records carry the tier split and the steps
DRAWS = 40  # replays under fresh step-noise draws, for the interval
QUANTILES = (50, 95, 99)


@dataclass(frozen=True)
class TtftPrediction:
    """One tier configuration's TTFT p50/p95/p99 in seconds: predicted (median over draws),
    the draws' 5th-95th percentile interval, and measured on the engine (NaN: not run)."""

    tier_config_id: str
    requests: int
    predicted_s: tuple[float, float, float]
    low_s: tuple[float, float, float]
    high_s: tuple[float, float, float]
    measured_s: tuple[float, float, float]

    def ratios(self) -> tuple[float, ...]:
        return tuple(p / m if m > 0 else float("nan") for p, m in zip(self.predicted_s, self.measured_s))

    def inside(self) -> tuple[bool, ...]:
        """Whether each measured percentile fell inside its predicted interval."""
        return tuple(lo <= m <= hi for lo, m, hi in zip(self.low_s, self.measured_s, self.high_s))


def engine_records(store: TraceStore, tier_config_id: str) -> list[RequestRecord]:
    """The engine's request records of one phase, in arrival order."""
    return list(calibration_inputs(store, engine=ENGINE, tier_config=tier_config_id).requests)


def calibrate_phase(store: TraceStore, tier_config_id: str, gpu_blocks: int, out: Path, *,
                    bytes_per_token: int, loaded_byte_s: float = 0.0, canary_steps: int = 0
                    ) -> tuple[EngineModelParams, int, int]:
    """The engine model fitted on one phase's requests and steps (the engine's GPU holding
    ``gpu_blocks`` KV blocks of ``bytes_per_token`` a token), written to ``out`` as a
    ``--cost-params`` file; the parameters, the requests and the steps fitted on. A GPU-only
    phase promotes nothing: ``loaded_byte_s`` (:func:`promotion_cost`, measured on
    ``canary_steps`` promoting steps) prices its loads, in the fit and in each resampled one.
    ``ValueError`` when the phase has too few requests or steps."""
    from kvtier.policy.latency.calibration import fit_costs, limits_for
    from kvtier.policy.latency.costfile import CostEvidence, write_cost_file

    # the phase's requests, and its steps from the first arrival to the last end
    inputs = calibration_inputs(store, engine=ENGINE, tier_config=tier_config_id)
    records, steps = list(inputs.requests), list(inputs.steps)
    limits = limits_for((ENGINE,), records, steps, kv_blocks=gpu_blocks)  # the engine's own rules
    # what kvtier calibrate fits: the engine model, its held-out check, each cost's evidence
    costs = fit_costs(records, steps, [], bytes_per_token=bytes_per_token, limits=limits,
                      written_by="kvtier demo")
    if costs.engine is None:
        raise ValueError(costs.held_out.get("single_server_note") or "too few records")
    params = costs.engine
    if loaded_byte_s > params.step_cost.loaded_byte_s:
        priced = lambda cost: replace(cost, loaded_byte_s=loaded_byte_s)  # noqa: E731
        params = replace(params, step_cost=priced(params.step_cost),
                         step_cost_draws=tuple(map(priced, params.step_cost_draws)))
        evidence = tuple(e for e in costs.costs if e.name != "step.loaded_byte_s") + (CostEvidence(
            "step.loaded_byte_s", loaded_byte_s, "measured", canary_steps,
            "a canary engine with a CPU tier: its promoting steps"),)
        costs = replace(costs, engine=params, costs=evidence)
    write_cost_file(out, costs)
    return params, len(records), len(steps)


CANARY_CLIENTS, CANARY_PROMPTS, CANARY_ROUNDS = 2, 4, 8


def promotion_cost(config, workdir: Path) -> tuple[float, int]:
    """Seconds per KV byte the reference engine's step spends promoting from its CPU tier
    on this host, and the promoting steps it was measured on: a canary engine of
    ``config``'s shape (``EngineConfig``; a CPU tier added), served over HTTP by two clients
    as the load probe serves the live one (its threads share the interpreter with the engine,
    and a promotion is mostly interpreter work), each sending its long prompts in turn, each
    twice in a row (the second time from the GPU); four such prompts are more than the GPU
    holds, so each comes back from the CPU tier. The promoting steps' time beyond the step
    cost fitted on the steps that promote nothing (prefills, GPU hits mapped, decodes), over
    their loaded bytes: a mean, as latencies add promotions up (on three live CPU-tier phases
    the median per step put it 11-24% lower: slow steps skew it). Run while the demo's engine is
    idle: it shares the host."""
    import random
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from kvtier.collector.events import Origin
    from kvtier.collector.recorder import Recorder
    from kvtier.policy.engine_model.fit import fit_step_cost
    from kvtier.policy.engine_model.step_cost import step_durations, step_features
    from kvtier.refengine.config import TierConfig
    from kvtier.refengine.server import MODEL_NAME, EngineServer, ServerSettings

    gpu = config.tiers.gpu_blocks
    tiers = TierConfig(gpu_blocks=gpu, cpu_blocks=CANARY_PROMPTS * gpu, config_id="canary")
    config = replace(config, tiers=tiers, file_dir=str(workdir))
    # the instrumentation the demo's engine carries: its cost is part of a promotion's
    recorder = Recorder(Origin(ENGINE, "canary", "canary/promotion"), capacity_events=1 << 20)
    rng = random.Random(0)
    blocks = max(2, min(gpu // 3, (config.max_positions - 64) // config.block_size_tokens))
    prompts = [[rng.randrange(config.vocab_size) for _ in range(blocks * config.block_size_tokens)]
               for _ in range(CANARY_PROMPTS)]
    server = EngineServer(config, ServerSettings(port=0, instance="canary"), recorder=recorder).start()

    def client(lane: int) -> None:
        mine, own = prompts[lane::CANARY_CLIENTS], random.Random(lane + 1)
        for turn in range(2 * CANARY_ROUNDS * len(mine)):
            suffix = [own.randrange(config.vocab_size) for _ in range(8)]  # always something to compute
            body = json.dumps({"model": MODEL_NAME, "prompt": mine[turn // 2 % len(mine)] + suffix,
                               "max_tokens": 2}).encode()
            request = urllib.request.Request(server.url + "/v1/completions", body,
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()

    try:
        with ThreadPoolExecutor(CANARY_CLIENTS) as pool:
            list(pool.map(client, range(CANARY_CLIENTS)))
    finally:
        server.stop()
    batch = recorder.take_events()
    names = list(StepRecord.__dataclass_fields__)
    steps = [StepRecord(**row) for row in batch.step_records.select(names).to_pylist()]
    loading = np.array([s.loaded_bytes > 0 for s in steps])
    if loading.sum() < 3 or (~loading).sum() < 8:
        return 0.0, int(loading.sum())
    quiet = [s for s, loads in zip(steps, loading) if not loads]
    cost = fit_step_cost(quiet)
    promoting = [s for s, loads in zip(steps, loading) if loads]
    excess = step_durations(promoting) - cost.seconds(step_features(promoting))
    timed = ~np.isnan(excess)
    loaded = float(sum(s.loaded_bytes for s, t in zip(promoting, timed) if t))
    return max(float(excess[timed].sum()) / loaded, 0.0), int(timed.sum())


def predict(params: EngineModelParams, records: Sequence[RequestRecord],
            splits: Sequence[RequestTokens], *, draws: int = DRAWS
            ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """TTFT p50/p95/p99 of ``records`` (arrival order) replayed with ``splits`` (one tier
    split each) by the engine model through the latency wing's one prediction function
    (``kvtier.policy.latency.predict``): the point and its 5th-95th percentile interval."""
    from kvtier.policy.latency import predict as latency
    from kvtier.policy.latency.models import StepModel, requests_for

    model = StepModel(params)
    samples = latency.draw(model, requests_for(model, records, splits), draws=draws)
    levels = latency.levels(samples, np.random.default_rng(0))
    return tuple(tuple(float(getattr(lv, f)) for lv in levels) for f in ("predicted", "low", "high"))


def tier_splits(records: Sequence[RequestRecord], gpu_blocks: int, cpu_blocks: int,
                cold_blocks: int) -> tuple[RequestTokens, ...]:
    """Each request's tier split under these sizes, as the recommendation replays it."""
    from kvtier.policy.learn.replay import Tiers, replay

    return replay(records, Tiers(gpu_blocks, cpu_blocks, cold_blocks), "lru").outcomes


def predicted_vs_measured(store: TraceStore, params: EngineModelParams, baseline: str,
                          phases: Sequence) -> list[TtftPrediction]:
    """For each measured phase (``PhaseTiers``-like: ``config_id``, ``gpu_blocks``,
    ``cpu_blocks``, ``cold_blocks``), the prediction over ``baseline``'s requests beside the
    phase's measured TTFT."""
    records = engine_records(store, baseline)
    out = []
    for tiers in phases:
        splits = tier_splits(records, tiers.gpu_blocks, tiers.cpu_blocks, tiers.cold_blocks)
        middle, low, high = predict(params, records, splits)
        measured = [r.ttft_s for r in engine_records(store, tiers.config_id) if r.ttft_s is not None]
        levels = np.percentile(measured, QUANTILES) if measured else [np.nan] * 3
        out.append(TtftPrediction(tiers.config_id, len(measured), middle, low, high,
                                  tuple(map(float, levels))))
    return out


@dataclass(frozen=True)
class PromiseRow:
    """One TTFT percentile of the recommendation's promise against the engine, over the same
    later share of each phase's requests: (predicted, low, high, measured) for the GPU tier
    alone, the recommended configuration and the change between them."""

    metric: str
    baseline: tuple[float, float, float, float]
    candidate: tuple[float, float, float, float]
    change: tuple[float, float, float, float]

    def ratios(self) -> tuple[float, float]:
        return tuple(p / m if m > 0 else float("nan") for p, _, _, m in (self.baseline, self.candidate))

    def inside(self) -> tuple[bool, bool, bool]:
        return tuple(lo <= m <= hi for _, lo, hi, m in (self.baseline, self.candidate, self.change))


def promise_vs_measured(store: TraceStore, rec, baseline: str, candidate: str) -> list[PromiseRow]:
    """The recommendation's own promise (``Evidence.expected_vs_gpu_only``) beside what the
    engine measured on the same later share of the ``baseline`` (GPU-only) and ``candidate``
    phases: each phase's requests in arrival order, the recommendation's training share left
    out (it warmed the tiers), as the promise counts them."""
    ev = rec.evidence
    if not ev.train_requests or not ev.evaluated_requests:
        return []
    share = ev.train_requests / (ev.train_requests + ev.evaluated_requests)

    def later(config: str) -> np.ndarray:
        ttft = np.array([r.ttft_s for r in engine_records(store, config) if r.ttft_s is not None])
        return ttft[int(len(ttft) * share):]

    base, cand = later(baseline), later(candidate)
    if not len(base) or not len(cand):
        return []
    rows = []
    for c in ev.expected_vs_gpu_only:
        if not c.metric.startswith("ttft_") or c.baseline_low is None:
            continue
        q = float(c.metric.split("_p")[1].removesuffix("_s"))
        mb, mc = float(np.percentile(base, q)), float(np.percentile(cand, q))
        rows.append(PromiseRow(c.metric, (c.baseline, c.baseline_low, c.baseline_high, mb),
                               (c.candidate, c.candidate_low, c.candidate_high, mc),
                               (c.change, c.low, c.high, mc - mb)))
    return rows
