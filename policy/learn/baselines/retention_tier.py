"""``learned-retention``, a row of ``kvtier evaluate`` only: the admission model's scores
(trained as for ``learned``) order the CPU tier's eviction, decayed by time since use with
``tau`` chosen on the training period. ``recommend`` deploys retention differently: as
TensorRT-LLM priorities that expire (``learn/expiring_retention.py``)."""

from __future__ import annotations

import math

from kvtier.policy.learn.admission_model import ModelConfig
from kvtier.policy.learn.pipeline import fit, score_offers
from kvtier.policy.learn.replay import Tiers
from kvtier.policy.learn.retention import choose_tau
from kvtier.policy.learn.retention import factory as retention_factory
from kvtier.policy.learn.split import Split

RETENTION = "learned-retention"


def retention_policy(split: Split, tiers: Tiers, fitted, seed: int):
    """The learned-retention CPU policy: the GBM's scores (trained as for ``learned``) order
    eviction, decayed by time since use with ``tau`` chosen on the training period."""
    if fitted is None:
        fitted = fit(split.train, split.records, tiers, ModelConfig(seed=seed), thresholds=(),
                     train_trace=split.train_trace, scored_trace=split.trace)
    train_scores = (fitted.scores if split.count_from > 0
                    else score_offers(fitted.model, split.train, tiers, trace=split.train_trace))
    tau, sweep = choose_tau(split.train, tiers, train_scores, trace=split.train_trace)
    summary = {"tau_s": _finite(tau), "sweep": [[_finite(t), r] for t, r in sweep],
               "train_offers": fitted.train_offers, "model": fitted.model.card()}
    return retention_factory(fitted.scores, tau), summary


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no infinity: None = pure score
