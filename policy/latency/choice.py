"""Which latency model may make a promise, and the card that says so.

A TTFT promise is made by a model that has shown it predicts this engine:

1. the step-level engine model, when its held-out check (fitted on the earlier requests,
   replayed on the later ones of every tier configuration the store holds) put TTFT p50 and
   p95 within :data:`TOLERANCE` of what the engine measured (how far it missed widens its
   intervals);
2. else the single-server queue model, when its own held-out ratios hold the same tolerance,
   or, unchecked, when its prefill rate was measured on this engine (not a default);
3. else none: the recommendation says why and what to run instead, and promises no TTFT.

Either model prices a CPU promotion too: where this engine's records never showed one (no
step loaded anything, no load job timed), that cost would be a default, and no TTFT is
promised for a CPU tier; the card says to run a canary phase with one.

A model that failed its check is flagged in every output (:attr:`LatencyChoice.flag`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtier.policy.cost import CostParams
from kvtier.policy.latency.models import QueueModel, StepModel

# predicted/measured TTFT p50 and p95 within [1/2, 2] on held-out requests: a gross miss (the
# 5-19x of a model blind to a CPU tier's promotions) makes no promise; a smaller one promises
# with its miss in its intervals (EngineModelParams.model_error_log_sd)
TOLERANCE = 2.0
CHECKED = ("ttft_p50_s", "ttft_p95_s")
CANARY = ("run a phase with a small CPU tier (kvtier push a recommendation's minimal tier, or "
          "kvtier rollout) so the store holds promotions and step records, then kvtier "
          "calibrate it, as kvtier demo does")


@dataclass(frozen=True)
class LatencyChoice:
    """The model a promise uses (``None``: no TTFT promise), why, and any failed check."""

    model: object | None
    why: str
    flag: str | None = None  # a model that missed its held-out check, in words
    thin: tuple[str, ...] = ()  # costs resting on few observations (their draws widen intervals)

    @property
    def promises(self) -> bool:
        return self.model is not None


def misses(held_out: dict | None, key: str = "ratio") -> list[str]:
    """The tier configurations whose held-out TTFT ratio (``ratio`` for the engine model,
    ``single_server_ratio`` for the queue model) misses :data:`TOLERANCE`, in words."""
    out = []
    for check in (held_out or {}).get("by_tier_config", ()):
        ratios = check.get(key) or {}
        for metric in CHECKED:
            value = ratios.get(metric)
            if value is None or not math.isfinite(value):
                continue
            if not 1 / TOLERANCE <= value <= TOLERANCE:
                name = metric.removesuffix("_s").replace("_", " ")
                out.append(f"{name} {value:.2f}x measured on {check.get('tier_config_id') or 'its requests'}")
    return out


def checked(held_out: dict | None, key: str = "ratio") -> bool:
    return any(isinstance((c.get(key) or {}).get(m), float) and math.isfinite(c[key][m])
               for c in (held_out or {}).get("by_tier_config", ()) for m in CHECKED)


NO_PROMOTION = ("a CPU promotion's cost on this engine is not measured (its records show "
                "no load): no TTFT is promised; ")


def choose(params: CostParams, engine=None, held_out: dict | None = None,
           servers: int = 1, promotion_measured: bool | None = None) -> LatencyChoice:
    """The model for a promise from what was fitted (see module doc). ``promotion_measured``:
    whether the records priced a promotion (``None``: as ``params``' CPU link says)."""
    if promotion_measured is None:
        promotion_measured = params.cpu_gpu_bandwidth_bytes_per_s.source != "default"
    choice = _choose(params, engine, held_out, servers)
    if choice.model is not None and not promotion_measured:
        return LatencyChoice(None, NO_PROMOTION + CANARY, choice.flag)
    return choice


def _choose(params: CostParams, engine, held_out: dict | None, servers: int) -> LatencyChoice:
    flag = None
    if engine is not None:
        missed = misses(held_out)
        if not checked(held_out):  # a file given without its check: used, and said so
            return LatencyChoice(StepModel(engine), "the engine model as given, not checked on "
                                 "held-out requests (kvtier calibrate --out adds the check)")
        if not missed:
            return LatencyChoice(StepModel(engine), "the engine model, held out within "
                                 f"{TOLERANCE}x of the engine's TTFT p50/p95")
        flag = "the engine model missed its held-out check: " + "; ".join(missed)
        if engine.limits.kv_blocks is None:
            flag += (" (it was given no GPU KV capacity, so it never holds a request back for "
                     "KV space: kvtier calibrate --gpu-blocks gives the engine's)")
    queue = QueueModel(params, servers)
    queue_missed = misses(held_out, "single_server_ratio")
    if checked(held_out, "single_server_ratio") and not queue_missed:
        return LatencyChoice(queue, f"the queue model, held out within {TOLERANCE}x", flag)
    if queue_missed:
        why = "the queue model missed its held-out check too: " + "; ".join(queue_missed)
    elif params.prefill_tokens_per_s.source == "default":
        why = ("the prefill rate is a default, not this engine's: no TTFT is promised; " + CANARY)
    else:
        return LatencyChoice(queue, "the queue model on the measured "
                             f"{params.prefill_tokens_per_s.source} prefill rate (unchecked)", flag)
    if flag is not None:
        why = f"{flag}; {why}"
    return LatencyChoice(None, why if "no TTFT" in why else f"{why}: no TTFT is promised", flag)


def choose_for(costs, params: CostParams | None = None, servers: int = 1) -> LatencyChoice:
    """:func:`choose` for a cost file (``costfile.CostFile``): its queue-model costs over
    ``params`` (default: the defaults), its engine model and held-out check, and whether its
    records priced a promotion (a file without that evidence, written by an older kvtier or
    by hand, is taken as given)."""
    from kvtier.policy.cost import measured_cost_params

    params = params or CostParams()
    if costs.cost_params:
        params = measured_cost_params({"probe": "calibrate", "cost_params": costs.cost_params},
                                      base=params)
    from dataclasses import replace

    from kvtier.policy.latency.calibration import thin

    measured = costs.promotion_measured() if costs.costs else True
    return replace(choose(params, costs.engine, costs.held_out, servers, measured),
                   thin=tuple(thin(costs.costs)))
