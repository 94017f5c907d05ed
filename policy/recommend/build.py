"""Build a :class:`Recommendation` from request records: verdict, model, sweep, settings.

Steps: split by time; cap the candidate CPU tier at the host headroom when one is given;
replay the GPU tier alone (is the GPU the limit?) and ask the reuse analysis for the
wrong-optimisation verdict; if offloading is worth trying, train the admission model at the
(capped) CPU capacity, turn scores into values and 0-100 priorities, sweep the offload
threshold on the training period's latest slice (both TRT-LLM comparisons), summarise the
priorities as per-request-class token ranges for TRT-LLM (and sweep its threshold over
those), and measure the chosen setting against the default (LRU, admit all) on the later,
held-out time with bootstrap intervals. vLLM gets its ``eviction_policy`` and ``store_threshold`` and the file-tier
decision (:func:`policy.recommend.cold_tier.decide`) from replays under its own semantics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from collector.events import RequestRecord
from policy.cost import CostParams, servers_for
from policy.recommend.cold_tier import MIN_COLD_GAIN, ColdCost, FileTierDecision, cost_from_params
from policy.recommend.cold_tier import decide as decide_file_tier
from policy.learn.compare import Split
from policy.learn.admission_model import ModelConfig
from policy.learn.pipeline import fit
from policy.learn.replay import IndexedAdmitter, Replayed, Tiers, replay
from policy.recommend import engines
from policy.recommend.expected import expected_changes
from policy.recommend.headroom import NOT_CHECKED, HostLimit
from policy.recommend.recommendation import Knob, Recommendation
from policy.recommend.token_ranges import (
    band_priorities,
    range_priorities,
    retention_classes,
)
from policy.recommend.sweep import THRESHOLDS, SweepPoint, best, priority_scores, sweep
from policy.recommend.value import full_block_value, priorities, value_per_byte
from policy.recommend.vllm_sweep import best_cpu_setting, cold_tier_gain
from policy.writers.settings import Guardrails

VALIDATION_FRACTION = 0.2
DEFAULT_COSTS = CostParams()


@dataclass(frozen=True)
class Inputs:
    """What to recommend for: tier sizes in blocks of the trace, and how to evaluate."""

    gpu_blocks: int
    cpu_blocks: int
    train_fraction: float = 0.5
    seed: int = 0
    prefill_servers: int | None = None  # None: size with policy.cost.servers_for
    windows: int = 10
    thresholds: tuple[int, ...] = THRESHOLDS
    host: HostLimit | None = None  # None: the CPU size is not checked against host memory
    cold_blocks: int = 0  # a candidate vLLM file tier (0: not considered)
    cold_path: str | None = None  # where it would live (None: decided, not written)
    cold_cost: ColdCost | None = None  # measured cold promotion (None: the cost model's)

    def __post_init__(self) -> None:
        for name in ("gpu_blocks", "cpu_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.prefill_servers is not None and self.prefill_servers < 1:
            raise ValueError(f"prefill_servers must be >= 1, got {self.prefill_servers!r}")
        if self.cold_blocks < 0:
            raise ValueError(f"cold_blocks must be >= 0, got {self.cold_blocks!r}")


def recommend(records: Sequence[RequestRecord], inputs: Inputs,
              params: CostParams = DEFAULT_COSTS,
              step: Callable[[str], None] = lambda name: None) -> Recommendation:
    """The recommendation for ``records``; ``step`` is called as each phase starts."""
    split = Split.by_time(records, inputs.train_fraction)
    block_tokens = records[0].block_size_tokens or 16
    block_bytes = block_tokens * params.model.bytes_per_token
    cpu_blocks, host = _host_cap(inputs, block_bytes)
    step("replaying the GPU tier alone")
    gpu_only = replay(split.records, Tiers(inputs.gpu_blocks, 0), "lru")
    verdict = _verdict(split.records, gpu_only.result.token_hit_ratio, params)
    if verdict["verdict"] == "wrong_optimisation" or cpu_blocks == 0:
        return _do_not_offload(verdict, gpu_only, host, block_bytes)
    tiers = Tiers(inputs.gpu_blocks, cpu_blocks)
    step("training the admission model")
    fitted = fit(split.train, split.records, tiers, ModelConfig(seed=inputs.seed),
                 thresholds=())
    top = full_block_value(block_tokens, params)
    keys = list(fitted.scores)
    p = np.asarray([fitted.scores[k] for k in keys])
    prio = priorities(value_per_byte(p, np.full(len(p), block_tokens), params), top)
    priority_by_offer = dict(zip(keys, prio.tolist()))
    bands = band_priorities(split.records, priority_by_offer, block_tokens)
    ranges = retention_classes(split.records, priority_by_offer, block_tokens)
    step("sweeping the offload threshold")
    validate_from = int(len(split.train) * (1 - VALIDATION_FRACTION))
    points = sweep(split.train, tiers, priority_by_offer, validate_from, inputs.thresholds)
    chosen, chosen_gt = best(points, "ge"), best(points, "gt")
    range_points = _range_sweep(split, tiers, priority_by_offer, ranges, block_tokens,
                                validate_from)
    range_gate = best(range_points, "ge")
    step("measuring on later time")
    baseline = replay(split.records, tiers, "lru", count_from=split.count_from)
    admitter = IndexedAdmitter(priority_scores(priority_by_offer, "ge"),
                               chosen.min_priority - 1e-9)
    candidate = replay(split.records, tiers, "lru", admitter=admitter,
                       count_from=split.count_from)
    learned_ratio = candidate.result.token_hit_ratio
    if candidate.result.recompute_tokens > baseline.result.recompute_tokens:
        # a guard, not a selection: never recommend a gate that lost to the default on the
        # held-out time; fall back to offloading every block (threshold 0)
        chosen = _admit_all(chosen)
        candidate = baseline
    servers = inputs.prefill_servers or servers_for(split.records[split.count_from:], params)
    changes = expected_changes(baseline, candidate, params, np.random.default_rng(inputs.seed),
                               windows=inputs.windows, servers=servers)
    cpu_bytes = cpu_blocks * block_bytes
    if host.get("capped"):  # what the cap costs: plain LRU at the requested size, later time
        host["token_hit_ratio_lru_at_requested"] = replay(
            split.records, Tiers(inputs.gpu_blocks, inputs.cpu_blocks), "lru",
            count_from=split.count_from).result.token_hit_ratio
        host["token_hit_ratio_lru_at_cap"] = baseline.result.token_hit_ratio
    classes = tuple(sorted(set(prio.tolist())))
    helps = candidate.result.token_hit_ratio > baseline.result.token_hit_ratio
    vllm_cpu, by_setting = best_cpu_setting(split.train, inputs.gpu_blocks, cpu_blocks,
                                            validate_from)
    file_tier = _file_tier(split.train, inputs, cpu_blocks, validate_from,
                           by_setting[vllm_cpu], params, block_tokens, vllm_cpu[0])
    vllm_file = (file_tier, inputs.cold_blocks * block_bytes, inputs.cold_path)
    per_engine, notes = engines.settings(cpu_bytes, chosen.min_priority, classes, helps,
                                         (ranges, range_gate.min_priority), vllm_cpu,
                                         vllm_file)
    later = _window_ratio(gpu_only, split.count_from)
    return Recommendation(
        verdict="offload",
        reasons=tuple(f"checked, does not hold: {r['reason']} ({r['evidence']})"
                      for r in verdict["reasons"] if r["holds"] is False),
        settings=engines.neutral(cpu_bytes, chosen.min_priority, classes),
        engine_settings=per_engine, engine_notes=notes,
        guardrails=_guardrails(inputs.host),
        knobs=_knobs(cpu_bytes, chosen, chosen_gt, classes, host) + _file_knob(vllm_file),
        expected=changes,
        evidence={"reuse_verdict": verdict, "model": fitted.model.card(),
                  "seed": inputs.seed, "block_tokens": block_tokens,
                  "prefill_servers": {"servers": servers, "source": (
                      "given" if inputs.prefill_servers else
                      "auto: the fewest keeping 80% utilisation with every prompt recomputed")},
                  "tiers_blocks": {"gpu": inputs.gpu_blocks, "cpu": cpu_blocks},
                  "host_memory": host,
                  "vllm_file_tier": None if file_tier is None else {
                      **file_tier.to_dict(), "cold_blocks": inputs.cold_blocks},
                  "train_requests": len(split.train),
                  "evaluated_requests": len(split.records) - split.count_from,
                  "sweep": [p.__dict__ for p in points],
                  "token_range_priorities": dict(bands),
                  "token_range_sweep": [p.__dict__ for p in range_points],
                  "vllm_cpu_setting_recomputed_tokens": {
                      f"{policy}/store_threshold={threshold}": tokens
                      for (policy, threshold), tokens in by_setting.items()},
                  "token_hit_ratio": {"gpu_only": later,
                                      "cpu_lru_admit_all": baseline.result.token_hit_ratio,
                                      "cpu_learned_priority": learned_ratio},
                  "admitter_misses": admitter.misses})


def _host_cap(inputs: Inputs, block_bytes: int) -> tuple[int, dict]:
    """The CPU tier in blocks under the host cap (if any), and the evidence saying so."""
    if inputs.host is None:
        return inputs.cpu_blocks, dict(NOT_CHECKED)
    blocks = min(inputs.cpu_blocks, inputs.host.cap_blocks(block_bytes))
    return blocks, inputs.host.evidence(inputs.cpu_blocks * block_bytes, blocks * block_bytes)


def _range_sweep(split: Split, tiers: Tiers, priority_by_offer: dict, ranges, block_tokens: int,
                 validate_from: int) -> list[SweepPoint]:
    """TensorRT-LLM sees the token ranges' priorities, not the per-block ones: sweep its
    threshold over those. Only the priorities in use are distinct thresholds (the lowest
    offloads every block)."""
    by_range = range_priorities(split.records, priority_by_offer, ranges, block_tokens)
    in_use = sorted({r.priority for c in ranges for r in c.token_ranges})
    return sweep(split.train, tiers, by_range, validate_from, in_use, ("ge",))


def _file_tier(train: Sequence[RequestRecord], inputs: Inputs, cpu_blocks: int,
               validate_from: int, recomputed_without: int, params: CostParams,
               block_tokens: int, policy: str) -> FileTierDecision | None:
    """vLLM's file tier, when one is a candidate: measured cost first, then simulated gain."""
    if not inputs.cold_blocks:
        return None
    gain = cold_tier_gain(train, inputs.gpu_blocks, cpu_blocks, inputs.cold_blocks,
                          validate_from, recomputed_without, policy)
    return decide_file_tier(gain, MIN_COLD_GAIN,
                            inputs.cold_cost or cost_from_params(params, block_tokens))


def _verdict(records: Sequence[RequestRecord], gpu_ratio: float, params: CostParams) -> dict:
    from policy.reuse import analyze

    return analyze(records, params, gpu_token_hit_ratio=gpu_ratio)["offloading"]


def _do_not_offload(verdict: dict, gpu_only: Replayed, host: dict,
                    block_bytes: int) -> Recommendation:
    held = [(r["reason"], r["evidence"]) for r in verdict["reasons"] if r["holds"]]
    if not held:  # the reuse verdict was to offload, but the host has no room for a block
        held = [("contested host DRAM: the host headroom holds no KV block",
                 (f"cap {host['cap_bytes']} bytes ({host['source']}) < one block of "
                  f"{block_bytes} bytes"))]
    return Recommendation(
        verdict="do_not_offload",
        reasons=tuple(f"{reason}: {evidence}" for reason, evidence in held),
        settings=engines.neutral(0, None, ()),
        engine_settings=engines.off(),
        knobs=(Knob("cpu_tier_bytes", 0, "; ".join(reason for reason, _ in held)),),
        evidence={"reuse_verdict": verdict, "host_memory": host,
                  "token_hit_ratio": {"gpu_only": gpu_only.result.token_hit_ratio}})


def _guardrails(host: HostLimit | None) -> Guardrails:
    """What ``kvtier push`` checks: the cap this recommendation was sized under."""
    return Guardrails(host_headroom_bytes=None if host is None else host.cap_bytes)


def _admit_all(chosen: SweepPoint) -> SweepPoint:
    return SweepPoint(0, "ge", chosen.token_hit_ratio, chosen.recompute_tokens,
                      chosen.cpu_stores_total, note="the learned gate recomputed more than "
                      "admitting every block on later time, so every block is offloaded")


def _knobs(cpu_bytes: int, chosen, chosen_gt, classes, host: dict) -> tuple[Knob, ...]:
    if not host["checked"]:
        sized = "not checked against host memory"
    elif host["capped"]:
        sized = (f"capped from {host['requested_cpu_bytes']} bytes at the host headroom "
                 f"less its safety margin ({host['cap_bytes']} bytes)")
    else:
        sized = f"within the host headroom less its safety margin ({host['cap_bytes']} bytes)"
    return (
        Knob("cpu_tier_bytes", cpu_bytes,
             f"the CPU capacity the model was trained and measured at; {sized}"),
        Knob("offload_min_priority", chosen.min_priority,
             chosen.note or
             f"fewest recomputed tokens on the validation slice ({chosen.token_hit_ratio:.4f} "
             f"token hit ratio with '>='; with TRT-LLM's documented '>' the best threshold is "
             f"{chosen_gt.min_priority} at {chosen_gt.token_hit_ratio:.4f})"),
        Knob("retention_priorities", list(classes),
             "learned value classes (P(reuse) x (recompute - promotion) per byte, 0..100)"),
    )


def _file_knob(vllm_file) -> tuple[Knob, ...]:
    decision, cold_bytes, _ = vllm_file
    if decision is None:
        return ()
    return (Knob("vllm_file_tier_bytes", cold_bytes if decision.add else 0, decision.reason),)


def _window_ratio(replayed: Replayed, count_from: int) -> float:
    outcomes = replayed.outcomes[count_from:]
    prompt = sum(r.prompt_tokens for r in replayed.requests[count_from:])
    hits = sum(o.gpu_hit_tokens + o.cpu_promotion_tokens + o.cold_promotion_tokens
               for o in outcomes)
    return hits / prompt if prompt else 0.0
