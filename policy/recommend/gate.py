"""The learned offload gate: train the admission model, turn its scores into 0-100
priorities, sweep the offload threshold, and measure the chosen gate on later time.

The model is trained on the training period at the CPU tier's size; each offer's score
becomes a value per byte and a priority (:mod:`kvtier.policy.recommend.value`); the threshold is
swept on the training period's latest slice for both TRT-LLM comparisons
(:mod:`kvtier.policy.recommend.sweep`); the priorities are summarised as per-request-class token
ranges for TRT-LLM and its threshold swept over those; the chosen gate is replayed against
the default (LRU, admit every block) on the later, held-out time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvtier.policy.cost import CostParams
from kvtier.policy.learn.admission_model import ModelConfig
from kvtier.policy.learn.expiring_retention import expiring
from kvtier.policy.learn.pipeline import fit
from kvtier.policy.learn.replay import IndexedAdmitter, Replayed, Tiers, replay
from kvtier.policy.learn.retention import choose_tau
from kvtier.policy.learn.split import Split
from kvtier.policy.recommend.sweep import THRESHOLDS, best, priority_scores, sweep
from kvtier.policy.recommend.token_ranges import band_priorities, range_priorities, retention_classes
from kvtier.policy.recommend.value import full_block_value, priorities, value_per_byte
from kvtier.policy.recommend.values import HeldOut, ModelCard, SweepPoint
from kvtier.policy.writers.trtllm_retention import DEFAULT_RETENTION_PRIORITY, RetentionClass

# A model whose held-out ROC AUC is below this ranks offers little better than chance: its
# scores set no threshold (every block is offloaded) and the report says so.
MIN_ROC_AUC = 0.6


@dataclass(frozen=True)
class Learned:
    """The admission model's outcome on the training period."""

    card: ModelCard
    priority_by_offer: dict
    classes: tuple[int, ...]
    bands: tuple[tuple[str, int], ...]
    ranges: tuple[RetentionClass, ...]  # priorities that expire after the decayed value
    points: tuple[SweepPoint, ...]
    chosen: SweepPoint
    chosen_gt: SweepPoint
    range_points: tuple[SweepPoint, ...]
    range_gate: SweepPoint
    tau_s: float = float("inf")  # the score's decay the ranges' expiries follow


@dataclass(frozen=True)
class Measured:
    """The chosen gate against the default on later time."""

    baseline: Replayed
    candidate: Replayed
    chosen: SweepPoint
    learned_ratio: float
    admitter_misses: int


def learn(split: Split, tiers: Tiers, params: CostParams, block_tokens: int,
          validate_from: int, *, seed: int = 0, thresholds: tuple[int, ...] = THRESHOLDS,
          step: Callable[[str], None] = lambda name: None) -> Learned:
    """Train the admission model, turn its scores into priorities, sweep the thresholds."""
    step("training the admission model")
    fitted = fit(split.train, split.records, tiers, ModelConfig(seed=seed), thresholds=())
    top = full_block_value(block_tokens, params)
    keys = list(fitted.scores)
    p = np.asarray([fitted.scores[k] for k in keys])
    prio = priorities(value_per_byte(p, np.full(len(p), block_tokens), params), top)
    priority_by_offer = dict(zip(keys, prio.tolist()))
    step("sweeping the offload threshold")
    points = tuple(sweep(split.train, tiers, priority_by_offer, validate_from, thresholds))
    ranges = retention_classes(split.records, priority_by_offer, block_tokens)
    tau_s = float("inf")
    if any(p > DEFAULT_RETENTION_PRIORITY for c in ranges for p in c.priorities):
        # the score's decay (learned retention's tau, chosen on the training period) sets
        # when a priority above the default expires (TensorRT-LLM duration_ms)
        tau_s, _ = choose_tau(split.train, tiers, fitted.scores)
        ranges = expiring(ranges, tau_s)
    range_points = tuple(_range_sweep(split, tiers, priority_by_offer, ranges, block_tokens,
                                      validate_from))
    card = _card(fitted.model.card())
    pick = best if card.weak is None else _weak_pick(card.weak)
    return Learned(
        card=card, priority_by_offer=priority_by_offer,
        classes=tuple(sorted(set(prio.tolist()))),
        bands=tuple(band_priorities(split.records, priority_by_offer, block_tokens).items()),
        ranges=ranges, points=points, chosen=pick(points, "ge"), chosen_gt=pick(points, "gt"),
        range_points=range_points, range_gate=pick(range_points, "ge"), tau_s=tau_s)


def _weak_pick(why: str):
    """For a weak model: the lowest threshold swept (it offloads every block), with why."""
    def pick(points, comparison: str) -> SweepPoint:
        lowest = min((p for p in points if p.comparison == comparison),
                     key=lambda p: p.min_priority)
        return dataclasses.replace(lowest, note=f"{why}: the lowest threshold, every block "
                                                "offloaded")
    return pick


def measure(split: Split, tiers: Tiers, learned: Learned) -> Measured:
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
    return Measured(baseline, candidate, chosen, learned_ratio, admitter.misses)


def _card(card: dict) -> ModelCard:
    held = card["held_out"]
    auc = held.get("roc_auc")
    weak = None
    if auc is None or auc < MIN_ROC_AUC:
        weak = (f"the model's held-out ROC AUC is {'unknown' if auc is None else f'{auc:.3f}'}, "
                f"under {MIN_ROC_AUC}: too near chance to set an offload threshold")
    return ModelCard(HeldOut(held["rows"], held["positive_rate"], held["brier"], auc),
                     tuple(card["features"]), tuple(sorted(card["config"].items())), weak)


def _range_sweep(split: Split, tiers: Tiers, priority_by_offer: dict, ranges, block_tokens: int,
                 validate_from: int) -> list[SweepPoint]:
    """TensorRT-LLM sees the token ranges' priorities, not the per-block ones: sweep its
    threshold over those. Only the priorities in use are distinct thresholds (the lowest
    offloads every block)."""
    by_range = range_priorities(split.records, priority_by_offer, ranges, block_tokens)
    in_use = sorted({r.priority for c in ranges for r in c.token_ranges})
    return sweep(split.train, tiers, by_range, validate_from, in_use, ("ge",))


def _admit_all(chosen: SweepPoint) -> SweepPoint:
    return SweepPoint(0, "ge", chosen.token_hit_ratio, chosen.recompute_tokens,
                      chosen.cpu_stores_total, note="the learned gate recomputed more than "
                      "admitting every block on later time, so every block is offloaded")
