"""Train the admission model at one capacity, score every offer, sweep the threshold.

The model outputs a score; the threshold is a separate parameter, chosen by replaying the
latest slice of the training period (never the evaluation period) at each candidate and
keeping the one with the highest token hit ratio there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.admission_model import AdmissionModel, ModelConfig, train
from kvtier.policy.learn.offers import OfferScores, collect_offers, score_offers_streamed
from kvtier.policy.learn.replay import IndexedAdmitter, Tiers, replay
from kvtier.policy.sim.trace import BlockTrace

# 0 admits every offer (plain LRU): the sweep can always fall back to the default
THRESHOLDS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7)
CENSORED_FRACTION = 0.1
# training rows kept at most (every k-th offer beyond): a day of a fleet offers tens of
# millions of blocks; the gradient-boosted trees bin features and gain little past this
MAX_TRAIN_ROWS = 2_000_000
DEFAULT_MODEL = ModelConfig()


@dataclass(frozen=True)
class LearnedAdmission:
    """A trained model, its score for every offer of the scored records, and the threshold
    the sweep chose (``sweep``: (threshold, token hit ratio on the validation slice))."""

    model: AdmissionModel
    scores: OfferScores
    threshold: float
    sweep: tuple[tuple[float, float], ...]
    train_offers: int
    train_positive_rate: float

    def admitter(self, threshold: float | None = None) -> IndexedAdmitter:
        return IndexedAdmitter(self.scores, self.threshold if threshold is None else threshold)


def fit(train_records: Sequence[RequestRecord], scored_records: Sequence[RequestRecord],
        tiers: Tiers, config: ModelConfig = DEFAULT_MODEL,
        thresholds: Sequence[float] = THRESHOLDS, *, shares_replay: bool = True,
        train_trace: BlockTrace | None = None, scored_trace: BlockTrace | None = None
        ) -> LearnedAdmission:
    """Label and train on ``train_records``; score the offers of ``scored_records``.
    ``shares_replay``: ``scored_records`` starts with ``train_records`` (one replay, request
    indices agree); otherwise the training records are scored on their own for the sweep.
    ``train_trace``/``scored_trace``: those records' blocks as arrays, when the caller has them."""
    labelled = collect_offers(train_records, tiers.gpu_blocks, tiers.cpu_blocks, label=True,
                              trace=train_trace, max_rows=MAX_TRAIN_ROWS)
    # offers late in the training period have no future left to be reused in: their labels
    # are censored, so the latest CENSORED_FRACTION of requests is not trained on
    resolved = labelled.request_index < int(len(train_records) * (1 - CENSORED_FRACTION))
    labelled = labelled.take(resolved)
    model = train(labelled.X, labelled.y, config)
    scores = score_offers(model, scored_records, tiers, trace=scored_trace)
    sweep_scores = scores if shares_replay or not thresholds else score_offers(
        model, train_records, tiers, trace=train_trace)
    sweep = _sweep(train_records, tiers, sweep_scores, config.calibration_fraction, thresholds,
                   train_trace)
    # no thresholds: the caller sweeps its own (e.g. over priorities); 0.5 stands in
    best = smoothed_best(sweep) if sweep else 0.5
    return LearnedAdmission(model, scores, best, tuple(sweep), len(labelled),
                            float(np.mean(labelled.y)) if len(labelled) else 0.0)


def smoothed_best(sweep: Sequence[tuple[float, float]]) -> float:
    """The threshold whose hit ratio, averaged with its neighbours' in the sweep, is the
    highest (ties: the higher threshold). The validation slice is short, so a single point
    is noisy; a threshold inside a plateau carries over to later time better than a spike."""
    ordered = sorted(sweep)
    ratios = [r for _, r in ordered]

    def smoothed(i: int) -> float:
        window = ratios[max(0, i - 1):i + 2]
        return sum(window) / len(window)

    best = max(range(len(ordered)), key=lambda i: (smoothed(i), ordered[i][0]))
    return ordered[best][0]


def score_offers(model: AdmissionModel, records: Sequence[RequestRecord], tiers: Tiers, *,
                 trace: BlockTrace | None = None) -> OfferScores:
    """The model's score for every CPU offer of a replay of ``records``, in offer order (also
    a mapping from (request index, block)); scored a chunk of offers at a time."""
    return score_offers_streamed(records, tiers.gpu_blocks, tiers.cpu_blocks, model.predict,
                                 trace=trace)


def _sweep(records: Sequence[RequestRecord], tiers: Tiers, scores: OfferScores,
           validation_fraction: float, thresholds: Sequence[float],
           trace: BlockTrace | None = None) -> list:
    count_from = int(len(records) * (1 - validation_fraction))
    trace = trace if trace is not None else BlockTrace.from_records(records)
    out = []
    for threshold in thresholds:
        result = replay(records, tiers, "lru", admitter=IndexedAdmitter(scores, threshold),
                        count_from=count_from, trace=trace).result
        out.append((float(threshold), result.token_hit_ratio))
    return out
