"""Build a :class:`Recommendation` from request records: verdict, sizes, gate, settings.

Steps: split by time; replay the GPU tier alone; size the CPU tier from the one-pass LRU
curve of all the requests (a size must hold the traffic's working set; the gate below is
trained on the earlier part and measured on the later) and the cost model, capped at the
host headroom when one is given (:mod:`kvtier.policy.recommend.sizing`); ask the reuse analysis
for its verdict on the same inputs ``kvtier analyze`` takes, refined by that size
(:mod:`kvtier.policy.recommend.decision`);
if offloading pays, train and sweep the learned offload gate at that size and measure it on
the later, held-out time against the default (LRU, admit all) and against the GPU tier alone,
with bootstrap intervals (:mod:`kvtier.policy.recommend.gate`, :mod:`kvtier.policy.recommend.expected`).
The cold tier is sized from the same curve above GPU + CPU at its (measured) cost; vLLM gets
its ``eviction_policy`` and ``store_threshold`` and the file-tier decision
(:func:`kvtier.policy.recommend.cold_tier.decide`) from replays under its own semantics. Every step
returns a typed value (:mod:`kvtier.policy.recommend.values`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.cost import CostParams, servers_for
from kvtier.policy.curves import HitRatioCurve, lru_curve
from kvtier.policy.learn.replay import Replayed, Tiers, replay
from kvtier.policy.learn.split import Split
from kvtier.policy.recommend import cpu_pair, engines
from kvtier.policy.recommend.cold_tier import MIN_COLD_GAIN, ColdCost, cost_from_params
from kvtier.policy.recommend.cold_tier import decide as decide_cold_tier
from kvtier.policy.recommend.decision import decide
from kvtier.policy.latency.choice import LatencyChoice
from kvtier.policy.recommend.promise import as_served, hit_quality, latency_model
from kvtier.policy.recommend.expected import expected_changes
from kvtier.policy.recommend.gate import Learned, Measured, learn, measure
from kvtier.policy.recommend.headroom import NOT_CHECKED, HostLimit
from kvtier.policy.recommend.knobs import cpu_knobs, file_knob, guardrails
from kvtier.policy.recommend.recommendation import Recommendation
from kvtier.policy.recommend.sizing import DEFAULT_MIN_GAIN_PER_GIB, cold_free_cap, tier_size
from kvtier.policy.recommend.input_sources import input_sources
from kvtier.policy.recommend.sweep import THRESHOLDS
from kvtier.policy.recommend.values import (
    ColdTierDecision,
    Evidence,
    HitRatios,
    HostCheck,
    InputSource,
    Knob,
    PrefillServers,
    RollbackRule,
    TierBlocks,
    TierSize,
    Verdict,
)
from kvtier.policy.recommend.vllm_sweep import best_cpu_setting, cold_tier_gain, vllm_replay
from kvtier.policy.rollback.rule import LatencyBudget
from kvtier.policy.writers.choices import Choices, FileTierChoice

VALIDATION_FRACTION = 0.2
DEFAULT_COSTS = CostParams()


@dataclass(frozen=True)
class Inputs:
    """What to recommend for: the GPU tier in blocks of the trace; the CPU and cold tiers
    (``None``: sized from the curve; a number fixes the size, still capped; ``cold_blocks``
    0: no cold tier considered); and how to evaluate."""

    gpu_blocks: int
    cpu_blocks: int | None = None
    train_fraction: float = 0.5
    seed: int = 0
    prefill_servers: int | None = None  # None: size with kvtier.policy.cost.servers_for
    thresholds: tuple[int, ...] = THRESHOLDS
    host: HostLimit | None = None  # None: the CPU size is not checked against host memory
    cold_blocks: int | None = 0
    cold_path: str | None = None  # where it would live (None: decided, not written)
    cold_cost: ColdCost | None = None  # measured cold promotion (None: the cost model's)
    min_gain_per_gib: float = DEFAULT_MIN_GAIN_PER_GIB  # the knee's threshold
    ttft_slo_s: float | None = None  # the p99 TTFT budget the reuse verdict and the rule check
    itl_slo_s: float | None = None  # the p99 ITL budget of the rollback rule
    baseline_tier_config: str | None = None  # the configuration the records were selected from
    gpu_source: str = "given"  # where gpu_blocks came from: given, measured or default
    gpu_note: str | None = None  # how it was measured
    # the latency model that may promise TTFT (kvtier.policy.latency.choice.LatencyChoice:
    # the engine model when its held-out check held, else the queue model, else none); None:
    # the queue model over ``params``, unchecked (a trace's what-if, no engine to check)
    latency: LatencyChoice | None = None
    costs: tuple[InputSource, ...] = ()  # the latency model's fitted costs, each with its count

    def __post_init__(self) -> None:
        if self.gpu_blocks < 1:
            raise ValueError(f"gpu_blocks must be >= 1, got {self.gpu_blocks!r}")
        for name, least in (("cpu_blocks", 1), ("cold_blocks", 0)):
            value = getattr(self, name)
            if value is not None and value < least:
                raise ValueError(f"{name} must be None (from the curve) or >= {least}, "
                                 f"got {value!r}")
        if self.prefill_servers is not None and self.prefill_servers < 1:
            raise ValueError(f"prefill_servers must be >= 1, got {self.prefill_servers!r}")
        if not self.min_gain_per_gib > 0:
            raise ValueError(f"min_gain_per_gib must be > 0, got {self.min_gain_per_gib!r}")
        for name in ("ttft_slo_s", "itl_slo_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.itl_slo_s is not None and self.ttft_slo_s is None:
            raise ValueError("an ITL budget needs the TTFT budget too (the rule checks both)")

    def rollback(self) -> RollbackRule | None:
        """The rule to deploy with the recommendation, at production windows."""
        if self.ttft_slo_s is None:
            return None
        defaults = LatencyBudget()
        return RollbackRule(self.ttft_slo_s, defaults.sustained_s, defaults.window_s,
                            self.itl_slo_s, self.baseline_tier_config)


def recommend(records: Sequence[RequestRecord], inputs: Inputs,
              params: CostParams = DEFAULT_COSTS,
              step: Callable[[str], None] = lambda name: None) -> Recommendation:
    """The recommendation for ``records``; ``step`` is called as each phase starts."""
    split = Split.by_time(records, inputs.train_fraction)
    block_tokens = records[0].block_size_tokens or 16
    step("replaying the GPU tier alone")
    gpu_only = replay(split.records, Tiers(inputs.gpu_blocks, 0), "lru")
    curve = lru_curve(split.records, block_tokens)  # sizes fit the traffic as a whole
    cpu = _cpu_size(curve, split, inputs, params, block_tokens)
    host = NOT_CHECKED if inputs.host is None else inputs.host.check(cpu.wanted_bytes,
                                                                      cpu.chosen_bytes)
    reuse = _reuse_verdict(split.records, gpu_only.result.token_hit_ratio, params, inputs)
    verdict = decide(reuse, cpu)
    sources = input_sources(params, inputs.gpu_blocks, block_tokens, inputs.gpu_source,
                            inputs.gpu_note) + inputs.costs
    servers = inputs.prefill_servers or servers_for(split.records[split.count_from:], params)
    model, card = latency_model(inputs.latency, params, servers, inputs.prefill_servers)
    gpu_later = replay(split.records, Tiers(inputs.gpu_blocks, 0), "lru",
                       count_from=split.count_from)
    if verdict.outcome == "do_not_offload":
        return _do_not_offload(verdict, reuse, split, gpu_later, host, cpu, sources, model, card,
                               inputs)
    tiers = Tiers(inputs.gpu_blocks, cpu.chosen_blocks)
    validate_from = int(len(split.train) * (1 - VALIDATION_FRACTION))
    pair = cpu_pair.choose(split.train, tiers, inputs.seed)  # admission and eviction, together
    learned = learn(split, tiers, params, block_tokens, validate_from, seed=inputs.seed,
                    thresholds=inputs.thresholds, step=step)
    step("measuring on later time")
    measured = measure(split, tiers, learned)
    changes, vs_gpu, admit_all_vs_gpu = (
        expected_changes(base, candidate, model, np.random.default_rng(inputs.seed))
        for base, candidate in ((measured.baseline, measured.candidate),
                                (gpu_later, measured.candidate),
                                (gpu_later, measured.baseline)))
    if host.capped:  # what the cap costs: plain LRU at the size asked for, later time
        host = dataclasses.replace(
            host, token_hit_ratio_lru_at_requested=replay(
                split.records, Tiers(inputs.gpu_blocks, cpu.wanted_bytes // cpu.block_bytes),
                "lru", count_from=split.count_from).result.token_hit_ratio,
            token_hit_ratio_lru_at_cap=measured.baseline.result.token_hit_ratio)
    vllm_blocks = vllm_cpu_blocks(cpu, inputs.gpu_blocks)
    vllm_setting, by_setting = best_cpu_setting(
        split.train, inputs.gpu_blocks, vllm_blocks, validate_from,
        thresholds=cpu_pair.thresholds(pair), gpu_sightings=cpu_pair.gpu_sightings(pair))
    vllm_cpu, vllm_gpu_sightings = vllm_setting[:2], vllm_setting[2]
    vllm_later = vllm_replay(split.records, inputs.gpu_blocks, vllm_blocks, split.count_from,
                             vllm_setting)
    vllm_vs_gpu = expected_changes(gpu_later, vllm_later, model, np.random.default_rng(inputs.seed))
    quality = hit_quality(verdict, model, card, vs_gpu, measured.candidate)
    if quality.outcome == "do_not_offload":
        return _do_not_offload(quality, reuse, split, gpu_later, host, cpu, sources, model, card,
                               inputs)
    served, served_config = as_served(split)
    vs_served = () if served is None else expected_changes(
        served, vllm_later, model, np.random.default_rng(inputs.seed))
    cold_size = _cold_size(curve, split, inputs, params, block_tokens, cpu.chosen_blocks)
    cold = _cold_tier(split.train, inputs, cold_size, vllm_blocks, validate_from,
                      by_setting[vllm_setting], params, block_tokens, vllm_cpu[0],
                      vllm_gpu_sightings)
    cold_bytes = 0 if cold_size is None else cold_size.chosen_bytes
    per_engine, notes = engines.settings(Choices(
        cpu.chosen_bytes, measured.chosen.min_priority, tuple(learned.classes),
        measured.candidate.result.token_hit_ratio > measured.baseline.result.token_hit_ratio,
        ranges=tuple(learned.ranges), range_min_priority=learned.range_gate.min_priority,
        vllm_cpu=vllm_cpu, vllm_cpu_bytes=vllm_blocks * cpu.block_bytes,
        vllm_gpu_sightings=vllm_gpu_sightings,
        file_tier=None if cold is None else FileTierChoice(cold.add, cold.reason, cold_bytes,
                                                           inputs.cold_path),
        admission=pair.pair.admission, min_sightings=pair.pair.min_sightings,
        gpu_sightings=pair.pair.gpu_sightings))
    evidence = dataclasses.replace(
        _evidence(split, inputs, reuse, host, gpu_only, learned, measured, servers, cpu,
                  cold_size, cold, by_setting, vs_gpu, block_tokens), inputs=sources,
        expected_admit_all_vs_gpu_only=admit_all_vs_gpu, expected_vllm_vs_gpu_only=vllm_vs_gpu,
        latency_model=card, expected_vs_served=vs_served, cpu_policy=cpu_pair.evidence(pair),
        served_tier_config=served_config)
    evidence = dataclasses.replace(evidence, token_hit_ratio=dataclasses.replace(
        evidence.token_hit_ratio, vllm=vllm_later.result.token_hit_ratio))
    return Recommendation(
        verdict=verdict,
        settings=engines.neutral(cpu.chosen_bytes, measured.chosen.min_priority, learned.classes),
        evidence=evidence, engine_settings=per_engine, engine_notes=notes,
        guardrails=guardrails(inputs.host),
        knobs=cpu_knobs(cpu, measured.chosen, learned.chosen_gt, learned.classes)
        + file_knob(cold, cold_bytes),
        expected=changes)


def _evidence(split: Split, inputs: Inputs, reuse: Verdict, host: HostCheck,
              gpu_only: Replayed, learned: Learned, measured: Measured, servers: int,
              cpu: TierSize, cold_size: TierSize | None, cold: ColdTierDecision | None,
              by_setting: dict, vs_gpu: tuple, block_tokens: int) -> Evidence:
    return Evidence(
        reuse_verdict=reuse, host_memory=host,
        token_hit_ratio=HitRatios(_window_ratio(gpu_only, split.count_from),
                                  measured.baseline.result.token_hit_ratio,
                                  measured.learned_ratio),
        model=learned.card, seed=inputs.seed, block_tokens=block_tokens,
        prefill_servers=PrefillServers(servers, (
            "given" if inputs.prefill_servers else
            "auto: the fewest keeping 80% utilisation with every prompt recomputed")),
        tiers_blocks=TierBlocks(inputs.gpu_blocks, cpu.chosen_blocks), vllm_file_tier=cold,
        train_requests=len(split.train),
        evaluated_requests=len(split.records) - split.count_from,
        sweep=learned.points, token_range_priorities=learned.bands,
        token_range_sweep=learned.range_points,
        vllm_cpu_setting_recomputed_tokens=tuple(
            (f"{policy}/store_threshold={threshold}"
             + (f"/gpu_sightings={gpu}" if gpu else ""), tokens)
            for (policy, threshold, gpu), tokens in by_setting.items()),
        admitter_misses=measured.admitter_misses,
        sizes=(cpu,) if cold_size is None else (cpu, cold_size), expected_vs_gpu_only=vs_gpu,
        rollback=inputs.rollback())


def vllm_cpu_blocks(cpu: TierSize, gpu_blocks: int) -> int:
    """vLLM's CPU tier for ``cpu``: vLLM writes every block it computes through to its CPU
    tier, which so holds a copy of the GPU's blocks; to hold ``cpu.chosen_blocks`` beyond the
    GPU it is the GPU's size larger (still capped where ``cpu`` was)."""
    if not cpu.chosen_blocks:
        return 0
    blocks = cpu.chosen_blocks + gpu_blocks
    return blocks if cpu.cap_bytes is None else min(blocks, cpu.cap_bytes // cpu.block_bytes)


def _cpu_size(curve: HitRatioCurve, split: Split, inputs: Inputs, params: CostParams,
              block_tokens: int) -> TierSize:
    """The CPU tier above the GPU, from the curve of all the requests, capped at the host."""
    saved = (params.recompute_s(block_tokens)
             - params.promotion_s(block_tokens, "cpu")) / block_tokens
    host = inputs.host
    return tier_size(curve, tier="cpu", offset_blocks=inputs.gpu_blocks,
                     block_bytes=block_tokens * params.model.bytes_per_token,
                     saved_s_per_token=saved, span_s=_span(split.records),
                     threshold_per_gib=inputs.min_gain_per_gib,
                     cap_bytes=None if host is None else host.cap_bytes,
                     cap_source=("not checked against host memory: give --headroom-json"
                                 if host is None else f"host headroom: {host.source}"),
                     given_blocks=inputs.cpu_blocks)


def _cold_size(curve: HitRatioCurve, split: Split, inputs: Inputs, params: CostParams,
               block_tokens: int, cpu_blocks: int) -> TierSize | None:
    """The cold tier above GPU + CPU, at its measured (or modelled) cost; ``None`` when no
    cold tier is considered. Capped at the cold path's free space, never sized to it."""
    if inputs.cold_blocks == 0:
        return None
    cost = inputs.cold_cost or cost_from_params(params, block_tokens)
    cap, source = (cold_free_cap(inputs.cold_path) if inputs.cold_path else
                   (None, "free space not checked: no --cold-path"))
    return tier_size(curve, tier="cold", offset_blocks=inputs.gpu_blocks + cpu_blocks,
                     block_bytes=block_tokens * params.model.bytes_per_token,
                     saved_s_per_token=(cost.recompute_s - cost.promotion_s) / block_tokens,
                     span_s=_span(split.records), threshold_per_gib=inputs.min_gain_per_gib,
                     cap_bytes=cap, cap_source=source, given_blocks=inputs.cold_blocks)


def _cold_tier(train: Sequence[RequestRecord], inputs: Inputs, size: TierSize | None,
               cpu_blocks: int, validate_from: int, recomputed_without: int,
               params: CostParams, block_tokens: int, policy: str,
               gpu_sightings: int = 0) -> ColdTierDecision | None:
    """vLLM's file tier, when one is a candidate: its size from the curve at its cost, then
    the gain replayed under vLLM's semantics at that size."""
    if size is None:
        return None
    cost = inputs.cold_cost or cost_from_params(params, block_tokens)
    if not size.chosen_blocks:
        return ColdTierDecision(False, f"do not add a file tier: {size.reason}; {cost.text}",
                                0.0, MIN_COLD_GAIN, cost, 0)
    gain = cold_tier_gain(train, inputs.gpu_blocks, cpu_blocks, size.chosen_blocks,
                          validate_from, recomputed_without, policy, gpu_sightings)
    return decide_cold_tier(gain, MIN_COLD_GAIN, cost, size.chosen_blocks)


def _reuse_verdict(records: Sequence[RequestRecord], gpu_ratio: float, params: CostParams,
                   inputs: Inputs) -> Verdict:
    """The reuse analysis's verdict on the same inputs ``kvtier analyze`` takes."""
    from kvtier.policy.reuse.collect import collect
    from kvtier.policy.reuse.verdict import verdict

    block_tokens = next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
    return verdict(collect(records, block_tokens), params, gpu_token_hit_ratio=gpu_ratio,
                   ttft_slo_s=inputs.ttft_slo_s,
                   host_cap_bytes=None if inputs.host is None else inputs.host.cap_bytes)


def _do_not_offload(verdict: Verdict, reuse: Verdict, split: Split, gpu_later: Replayed,
                    host: HostCheck, cpu: TierSize, sources: tuple[InputSource, ...], model,
                    card, inputs: Inputs) -> Recommendation:
    """No CPU tier: the GPU tier alone on later time, its TTFT levels promised (the change
    against itself is none), and against the requests as served; each engine's settings
    that turn offloading off (vLLM: the minimal CPU tier, so kvtier keeps recording)."""
    held = "; ".join(r.name for r in verdict.reasons if r.holds) or (verdict.note or "")
    levels = expected_changes(gpu_later, gpu_later, model, np.random.default_rng(inputs.seed))
    # vLLM runs the minimal CPU tier: its GPU tier under its own semantics is what it serves
    vllm_alone = vllm_replay(split.records, inputs.gpu_blocks, 0, split.count_from)
    served, served_config = as_served(split)
    vs_served = () if served is None else expected_changes(
        served, vllm_alone, model, np.random.default_rng(inputs.seed))
    return Recommendation(
        verdict=verdict, settings=engines.neutral(0, None, ()),
        evidence=Evidence(reuse_verdict=reuse, host_memory=host,
                          token_hit_ratio=HitRatios(gpu_later.result.token_hit_ratio,
                                                    vllm=vllm_alone.result.token_hit_ratio),
                          sizes=(cpu,), inputs=sources, latency_model=card,
                          tiers_blocks=TierBlocks(inputs.gpu_blocks, 0),
                          train_requests=len(split.train),
                          evaluated_requests=len(split.records) - split.count_from,
                          expected_vs_gpu_only=levels, expected_vs_served=vs_served,
                          served_tier_config=served_config,
                          rollback=inputs.rollback()),
        engine_settings=engines.off(), knobs=(Knob("cpu_tier_bytes", 0, held),))


def _span(records: Sequence[RequestRecord]) -> float:
    return records[-1].arrival_s - records[0].arrival_s if records else 0.0


def _window_ratio(replayed: Replayed, count_from: int) -> float:
    outcomes = replayed.outcomes[count_from:]
    prompt = sum(r.prompt_tokens for r in replayed.requests[count_from:])
    hits = sum(o.gpu_hit_tokens + o.cpu_promotion_tokens + o.cold_promotion_tokens
               for o in outcomes)
    return hits / prompt if prompt else 0.0
