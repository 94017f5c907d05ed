"""Build a :class:`Recommendation` from request records: verdict, model, sweep, settings.

Steps: split by time; cap the candidate CPU tier at the host headroom when one is given;
replay the GPU tier alone (is the GPU the limit?) and ask the reuse analysis for the
verdict; if offloading is worth trying, train the admission model at the (capped) CPU
capacity, turn scores into values and 0-100 priorities, sweep the offload threshold on the
training period's latest slice (both TRT-LLM comparisons), summarise the priorities as
per-request-class token ranges for TRT-LLM (and sweep its threshold over those), and
measure the chosen setting against the default (LRU, admit all) on the later, held-out time
with bootstrap intervals. vLLM gets its ``eviction_policy`` and ``store_threshold`` and the
file-tier decision (:func:`policy.recommend.cold_tier.decide`) from replays under its own
semantics. Every step returns a typed value (:mod:`policy.recommend.values`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from collector.events import RequestRecord
from policy.cost import CostParams, servers_for
from policy.learn.admission_model import ModelConfig
from policy.learn.compare import Split
from policy.learn.pipeline import fit
from policy.learn.replay import IndexedAdmitter, Replayed, Tiers, replay
from policy.recommend import engines
from policy.recommend.cold_tier import MIN_COLD_GAIN, ColdCost, cost_from_params
from policy.recommend.cold_tier import decide as decide_cold_tier
from policy.recommend.expected import expected_changes
from policy.recommend.headroom import NOT_CHECKED, HostLimit
from policy.recommend.knobs import cpu_knobs, file_knob, guardrails
from policy.recommend.recommendation import Recommendation
from policy.recommend.sweep import THRESHOLDS, best, priority_scores, sweep
from policy.recommend.token_ranges import band_priorities, range_priorities, retention_classes
from policy.recommend.value import full_block_value, priorities, value_per_byte
from policy.recommend.values import (
    ColdTierDecision,
    Evidence,
    HeldOut,
    HitRatios,
    HostCheck,
    Knob,
    ModelCard,
    PrefillServers,
    Reason,
    SweepPoint,
    TierBlocks,
    Verdict,
)
from policy.recommend.vllm_sweep import best_cpu_setting, cold_tier_gain

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


@dataclass(frozen=True)
class _Learned:
    """The admission model's outcome on the training period."""

    card: ModelCard
    priority_by_offer: dict
    classes: tuple[int, ...]
    bands: tuple[tuple[str, int], ...]
    ranges: tuple
    points: tuple[SweepPoint, ...]
    chosen: SweepPoint
    chosen_gt: SweepPoint
    range_points: tuple[SweepPoint, ...]
    range_gate: SweepPoint


@dataclass(frozen=True)
class _Measured:
    """The chosen gate against the default on later time."""

    baseline: Replayed
    candidate: Replayed
    chosen: SweepPoint
    learned_ratio: float
    admitter_misses: int


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
    reuse = _verdict(split.records, gpu_only.result.token_hit_ratio, params)
    if reuse.outcome == "do_not_offload" or cpu_blocks == 0:
        return _do_not_offload(reuse, gpu_only, host, block_bytes)
    tiers = Tiers(inputs.gpu_blocks, cpu_blocks)
    validate_from = int(len(split.train) * (1 - VALIDATION_FRACTION))
    learned = _learn(split, tiers, inputs, params, block_tokens, validate_from, step)
    step("measuring on later time")
    measured = _measure(split, tiers, learned)
    servers = inputs.prefill_servers or servers_for(split.records[split.count_from:], params)
    changes = expected_changes(measured.baseline, measured.candidate, params,
                               np.random.default_rng(inputs.seed), windows=inputs.windows,
                               servers=servers)
    if host.capped:  # what the cap costs: plain LRU at the requested size, later time
        host = dataclasses.replace(
            host, token_hit_ratio_lru_at_requested=replay(
                split.records, Tiers(inputs.gpu_blocks, inputs.cpu_blocks), "lru",
                count_from=split.count_from).result.token_hit_ratio,
            token_hit_ratio_lru_at_cap=measured.baseline.result.token_hit_ratio)
    cpu_bytes = cpu_blocks * block_bytes
    helps = measured.candidate.result.token_hit_ratio > measured.baseline.result.token_hit_ratio
    vllm_cpu, by_setting = best_cpu_setting(split.train, inputs.gpu_blocks, cpu_blocks,
                                            validate_from)
    cold = _cold_tier(split.train, inputs, cpu_blocks, validate_from, by_setting[vllm_cpu],
                      params, block_tokens, vllm_cpu[0])
    cold_bytes = inputs.cold_blocks * block_bytes
    per_engine, notes = engines.settings(
        cpu_bytes, measured.chosen.min_priority, learned.classes, helps, ranges=learned.ranges,
        range_min_priority=learned.range_gate.min_priority, vllm_cpu=vllm_cpu, cold=cold,
        cold_bytes=cold_bytes, cold_path=inputs.cold_path)
    evidence = Evidence(
        reuse_verdict=reuse, host_memory=host,
        token_hit_ratio=HitRatios(_window_ratio(gpu_only, split.count_from),
                                  measured.baseline.result.token_hit_ratio,
                                  measured.learned_ratio),
        model=learned.card, seed=inputs.seed, block_tokens=block_tokens,
        prefill_servers=PrefillServers(servers, (
            "given" if inputs.prefill_servers else
            "auto: the fewest keeping 80% utilisation with every prompt recomputed")),
        tiers_blocks=TierBlocks(inputs.gpu_blocks, cpu_blocks), vllm_file_tier=cold,
        train_requests=len(split.train),
        evaluated_requests=len(split.records) - split.count_from,
        sweep=learned.points, token_range_priorities=learned.bands,
        token_range_sweep=learned.range_points,
        vllm_cpu_setting_recomputed_tokens=tuple(
            (f"{policy}/store_threshold={threshold}", tokens)
            for (policy, threshold), tokens in by_setting.items()),
        admitter_misses=measured.admitter_misses)
    return Recommendation(
        verdict=_offload_verdict(reuse),
        settings=engines.neutral(cpu_bytes, measured.chosen.min_priority, learned.classes),
        evidence=evidence, engine_settings=per_engine, engine_notes=notes,
        guardrails=guardrails(inputs.host),
        knobs=cpu_knobs(cpu_bytes, measured.chosen, learned.chosen_gt, learned.classes, host)
        + file_knob(cold, cold_bytes),
        expected=changes)


def _learn(split: Split, tiers: Tiers, inputs: Inputs, params: CostParams, block_tokens: int,
           validate_from: int, step: Callable[[str], None]) -> _Learned:
    """Train the admission model, turn its scores into priorities, sweep the thresholds."""
    step("training the admission model")
    fitted = fit(split.train, split.records, tiers, ModelConfig(seed=inputs.seed), thresholds=())
    top = full_block_value(block_tokens, params)
    keys = list(fitted.scores)
    p = np.asarray([fitted.scores[k] for k in keys])
    prio = priorities(value_per_byte(p, np.full(len(p), block_tokens), params), top)
    priority_by_offer = dict(zip(keys, prio.tolist()))
    step("sweeping the offload threshold")
    points = tuple(sweep(split.train, tiers, priority_by_offer, validate_from, inputs.thresholds))
    ranges = retention_classes(split.records, priority_by_offer, block_tokens)
    range_points = tuple(_range_sweep(split, tiers, priority_by_offer, ranges, block_tokens,
                                      validate_from))
    return _Learned(
        card=_card(fitted.model.card()), priority_by_offer=priority_by_offer,
        classes=tuple(sorted(set(prio.tolist()))),
        bands=tuple(band_priorities(split.records, priority_by_offer, block_tokens).items()),
        ranges=ranges, points=points, chosen=best(points, "ge"), chosen_gt=best(points, "gt"),
        range_points=range_points, range_gate=best(range_points, "ge"))


def _measure(split: Split, tiers: Tiers, learned: _Learned) -> _Measured:
    """The chosen gate and the default (LRU, admit all) replayed; later time counted."""
    baseline = replay(split.records, tiers, "lru", count_from=split.count_from)
    admitter = IndexedAdmitter(priority_scores(learned.priority_by_offer, "ge"),
                               learned.chosen.min_priority - 1e-9)
    candidate = replay(split.records, tiers, "lru", admitter=admitter,
                       count_from=split.count_from)
    learned_ratio, chosen = candidate.result.token_hit_ratio, learned.chosen
    if candidate.result.recompute_tokens > baseline.result.recompute_tokens:
        # a guard, not a selection: never recommend a gate that lost to the default on the
        # held-out time; fall back to offloading every block (threshold 0)
        chosen, candidate = _admit_all(chosen), baseline
    return _Measured(baseline, candidate, chosen, learned_ratio, admitter.misses)


def _card(card: dict) -> ModelCard:
    held = card["held_out"]
    return ModelCard(HeldOut(held["rows"], held["positive_rate"], held["brier"],
                             held.get("roc_auc")),
                     tuple(card["features"]), tuple(sorted(card["config"].items())))


def _host_cap(inputs: Inputs, block_bytes: int) -> tuple[int, HostCheck]:
    """The CPU tier in blocks under the host cap (if any), and the evidence saying so."""
    if inputs.host is None:
        return inputs.cpu_blocks, NOT_CHECKED
    blocks = min(inputs.cpu_blocks, inputs.host.cap_blocks(block_bytes))
    return blocks, inputs.host.check(inputs.cpu_blocks * block_bytes, blocks * block_bytes)


def _range_sweep(split: Split, tiers: Tiers, priority_by_offer: dict, ranges, block_tokens: int,
                 validate_from: int) -> list[SweepPoint]:
    """TensorRT-LLM sees the token ranges' priorities, not the per-block ones: sweep its
    threshold over those. Only the priorities in use are distinct thresholds (the lowest
    offloads every block)."""
    by_range = range_priorities(split.records, priority_by_offer, ranges, block_tokens)
    in_use = sorted({r.priority for c in ranges for r in c.token_ranges})
    return sweep(split.train, tiers, by_range, validate_from, in_use, ("ge",))


def _cold_tier(train: Sequence[RequestRecord], inputs: Inputs, cpu_blocks: int,
               validate_from: int, recomputed_without: int, params: CostParams,
               block_tokens: int, policy: str) -> ColdTierDecision | None:
    """vLLM's file tier, when one is a candidate: measured cost first, then simulated gain."""
    if not inputs.cold_blocks:
        return None
    gain = cold_tier_gain(train, inputs.gpu_blocks, cpu_blocks, inputs.cold_blocks,
                          validate_from, recomputed_without, policy)
    return decide_cold_tier(gain, MIN_COLD_GAIN,
                            inputs.cold_cost or cost_from_params(params, block_tokens),
                            inputs.cold_blocks)


def _verdict(records: Sequence[RequestRecord], gpu_ratio: float, params: CostParams) -> Verdict:
    from policy.reuse.collect import collect
    from policy.reuse.verdict import verdict

    block_tokens = next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
    return verdict(collect(records, block_tokens), params, gpu_token_hit_ratio=gpu_ratio)


def _offload_verdict(reuse: Verdict) -> Verdict:
    """Offload; when the reuse analysis alone could not tell, say what decided it."""
    note = None
    if reuse.outcome == "inconclusive":
        unknown = ", ".join(r.name for r in reuse.reasons if r.holds is None)
        note = (f"the reuse analysis alone is inconclusive (cannot tell: {unknown}); no reason "
                "not to offload holds, and the CPU tier's gain was measured by replay")
    return Verdict("offload", reuse.reasons, note)


def _do_not_offload(reuse: Verdict, gpu_only: Replayed, host: HostCheck,
                    block_bytes: int) -> Recommendation:
    reasons = reuse.reasons
    note = None
    if not reuse.held():  # the reuse verdict allowed offloading, but the host has no room
        reasons += (Reason("contested host DRAM: the host headroom holds no KV block",
                           True, f"cap {host.cap_bytes} bytes ({host.source}) < one block of "
                                 f"{block_bytes} bytes"),)
        note = "the host headroom holds no KV block"
    held = "; ".join(r.name for r in reasons if r.holds)
    return Recommendation(
        verdict=Verdict("do_not_offload", reasons, note),
        settings=engines.neutral(0, None, ()),
        evidence=Evidence(reuse_verdict=reuse, host_memory=host,
                          token_hit_ratio=HitRatios(gpu_only.result.token_hit_ratio)),
        engine_settings=engines.off(),
        knobs=(Knob("cpu_tier_bytes", 0, held),))


def _admit_all(chosen: SweepPoint) -> SweepPoint:
    return SweepPoint(0, "ge", chosen.token_hit_ratio, chosen.recompute_tokens,
                      chosen.cpu_stores_total, note="the learned gate recomputed more than "
                      "admitting every block on later time, so every block is offloaded")


def _window_ratio(replayed: Replayed, count_from: int) -> float:
    outcomes = replayed.outcomes[count_from:]
    prompt = sum(r.prompt_tokens for r in replayed.requests[count_from:])
    hits = sum(o.gpu_hit_tokens + o.cpu_promotion_tokens + o.cold_promotion_tokens
               for o in outcomes)
    return hits / prompt if prompt else 0.0
