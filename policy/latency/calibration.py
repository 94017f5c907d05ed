"""Every latency cost an engine's records can show, fitted in one place, with its evidence.

:func:`fit_costs` takes what the collector's reader selected (request records with their
tier split, the step records and promotion jobs of the same selection) and returns the cost
file (``costfile.py``):

* the single-server queue model's costs (``kvtier.policy.calibrate``: prefill rate from
  requests that ran alone, a promotion link from load jobs);
* the step-level engine model fitted on every request and step
  (``kvtier.policy.engine_model.fit``): step costs by NNLS on the step records, the cost of
  a promoted byte from the steps that load, the admission delay, the batching limits;
* the held-out check: the engine model fitted on the earlier requests and replayed on the
  later ones of each tier configuration, the queue model beside it
  (``check.py``), which decides whether either may make a promise (``choice.py``);
* each cost's source and the number of observations behind it (:class:`CostEvidence`).

``kvtier calibrate``, ``kvtier recommend`` on a store and the demo all call it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from kvtier.collector.events import RequestRecord, StepRecord
from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits
from kvtier.policy.latency.costfile import CostEvidence, CostFile

MIN_OBSERVATIONS = 20  # fewer: a cost is "thin", and a promise resting on it says so
# How each engine whose steps kvtier records runs a step: (first token, promotions); see
# SchedulerLimits. kvtier's reference engine emits a first token right after its own prefill
# and copies promotions inside the admitting step; vLLM samples the batch at the step's end
# and loads promoted KV in a step of its own before the request computes.
ENGINE_RULES = {"reference": ("own_prefill", "in_step")}
DEFAULT_RULES = ("step_end", "load_step")


def limits_for(engines, records: Sequence[RequestRecord], steps: Sequence[StepRecord], *,
               kv_blocks: int | None = None, max_running: int | None = None,
               token_budget: int | None = None, chunked_prefill: bool = False,
               first_token: str = "auto", promotions: str = "auto") -> SchedulerLimits:
    """Batching limits for ``engines``' records: ``auto`` rules from :data:`ENGINE_RULES`
    (every engine the reference engine: its rules; else vLLM's), the rest fitted
    (``engine_model.fit.fit_limits``)."""
    from kvtier.policy.engine_model.fit import fit_limits

    rules = {ENGINE_RULES.get(e, DEFAULT_RULES) for e in engines} or {DEFAULT_RULES}
    own = rules.pop() if len(rules) == 1 else DEFAULT_RULES
    return fit_limits(records, steps, max_running=max_running, token_budget=token_budget,
                      chunked_prefill=chunked_prefill,
                      first_token=own[0] if first_token == "auto" else first_token,
                      kv_blocks=kv_blocks, promotions=own[1] if promotions == "auto" else promotions)


def fit_costs(requests: Sequence[RequestRecord], steps: Sequence[StepRecord], jobs, *,
              bytes_per_token: int | None = None, limits: SchedulerLimits | None = None,
              fit_share: float = 0.5, arrivals: str = "auto",
              written_by: str = "kvtier calibrate") -> CostFile:
    """The cost file for these records (see module doc); the engine model and its check are
    left out, with the reason in ``held_out["note"]``, when there are too few to fit."""
    from kvtier.policy.calibrate import calibrate
    from kvtier.policy.engine_model.fit import fit_engine
    from kvtier.policy.latency.check import held_out_check

    try:
        single = calibrate(requests, jobs, bytes_per_token=bytes_per_token)
        body = json.loads(single.to_json())
        cost_params, fits, note = body["cost_params"], body["fits"], ""
    except ValueError as error:
        single, cost_params, fits, note = None, {}, {}, str(error)
    try:
        engine = fit_engine(requests, steps, jobs, bytes_per_token=bytes_per_token, limits=limits,
                            arrivals=arrivals)
    except ValueError as error:
        engine, note = None, f"{note}; engine model: {error}" if note else f"engine model: {error}"
    try:
        held = held_out_check(requests, steps, jobs, bytes_per_token=bytes_per_token,
                              limits=limits, fit_share=fit_share, arrivals=arrivals).to_dict()
        held.pop("params", None)
    except ValueError as error:
        held = {"note": str(error)}
    if note:
        held["single_server_note"] = held.get("single_server_note") or note
    if engine is not None and "by_tier_config" in held:  # the model's own error, for its intervals
        from dataclasses import replace

        from kvtier.policy.latency.check import model_error_log_sd

        engine = replace(engine, model_error_log_sd=model_error_log_sd(held["by_tier_config"]))
    evidence = cost_evidence(requests, steps, jobs, single, engine)
    return CostFile(cost_params, bytes_per_token, engine, held, evidence, fits, written_by)


def cost_evidence(requests: Sequence[RequestRecord], steps: Sequence[StepRecord], jobs,
                  single, engine) -> tuple[CostEvidence, ...]:
    """Each fitted cost with what it rests on: requests that ran alone, timed steps, steps
    that load, load jobs, hand-offs."""
    from kvtier.policy.calibrate import ran_alone
    from kvtier.policy.engine_model.step_cost import step_durations

    out = []
    if single is not None:
        alone = sum(ran_alone(requests))
        p = single.params
        out.append(CostEvidence("prefill_tokens_per_s", p.prefill_tokens_per_s.value,
                                p.prefill_tokens_per_s.source, alone, "requests that ran alone"))
        cpu_jobs = sum(1 for j in jobs if j.tier == "cpu")
        if "cpu" in single.promotion:
            out.append(CostEvidence("cpu_gpu_op_latency_s", p.cpu_gpu_op_latency_s.value,
                                    "measured", cpu_jobs, "load jobs (a fixed wait per job)"))
            out.append(CostEvidence("cpu_gpu_bandwidth_bytes_per_s",
                                    p.cpu_gpu_bandwidth_bytes_per_s.value, "measured", cpu_jobs,
                                    "load jobs (bytes over time beyond the fixed wait)"))
    if engine is None:
        return tuple(out)
    timed = int((~np.isnan(step_durations(steps))).sum()) if steps else 0
    loading = sum(1 for s in steps if s.loaded_bytes > 0 and s.duration_s is not None)
    cost, source = engine.step_cost, "measured"
    basis = "timed step records" if engine.fitted_from == "step_records" else "request TTFT/ITL quantiles"
    count = timed if engine.fitted_from == "step_records" else len(requests)
    for name in ("overhead_s", "prefill_token_s", "decode_request_s", "cached_token_s"):
        out.append(CostEvidence(f"step.{name}", getattr(cost, name), source, count, basis))
    out.append(CostEvidence("step.loaded_byte_s", cost.loaded_byte_s, source if loading else "default",
                            loading, "steps that load promoted KV" if loading
                            else "no step loaded anything: a promotion's cost in the step is unknown"))
    handed = sum(1 for r in requests if r.handoff_s is not None)
    if engine.admission_delay_s:
        out.append(CostEvidence("admission_delay_p50_s", float(np.median(engine.admission_delay_s)),
                                source, handed or None, "hand-offs" if handed else "idle arrivals"))
    return tuple(out)


def thin(evidence: Sequence[CostEvidence]) -> list[str]:
    """The costs that rest on fewer than :data:`MIN_OBSERVATIONS` observations, in words."""
    return [f"{c.name} on {c.observations} {c.note}" for c in evidence
            if c.observations is not None and c.observations < MIN_OBSERVATIONS]
