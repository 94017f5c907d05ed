"""Which request signals the next-use model leans on, measured on later time.

Permutation importance: the model's two tree ensembles are scored on the rows of the
*evaluated* requests (what a policy knew of each once it finished, :mod:`kvtier.policy.learn
.request_signals`), then again with one feature's column shuffled among those rows; the loss
is what that signal was worth on traffic the model had not seen. Continuation (will the
chain come back?) is scored by ROC AUC; the gap scale (when?) by the rank correlation of its
prediction with the real gap to the chain's next request, among the chains that came back —
ranks are what order eviction. A signal the trees never split on loses nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kvtier.policy.learn.nextuse import NextUseModel
from kvtier.policy.learn.request_signals import FEATURES
from kvtier.policy.learn.signal_table import SignalTable, signal_table
from kvtier.policy.learn.split import Split

REPEATS = 3
MAX_ROWS = 20_000  # evaluated rows scored (an even sample of them beyond)
MIN_GAP_S = 0.5


@dataclass(frozen=True)
class FeatureDrop:
    """What shuffling one feature on later time cost each score (None: no such model)."""

    feature: str
    continuation_auc_drop: float | None
    gap_rank_drop: float | None


@dataclass(frozen=True)
class Importance:
    """Scores on the evaluated requests' rows and the drop per feature, largest first."""

    rows: int
    continuation_auc: float | None
    gap_rank_correlation: float | None
    features: tuple[FeatureDrop, ...]

    def to_json(self) -> dict:
        return asdict(self)


def later_rows(split: Split, signals: SignalTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the evaluated requests (``signals``: all of ``split.records``'), whether their
    chain came back, and ln of the gap."""
    later = slice(split.count_from, len(split.records))
    X = signals.rows[later]
    succ = signals.successor[later]
    continued = succ >= 0
    finish = signals.finish_s[later]
    gap = np.where(continued, np.maximum(signals.arrival_s[np.maximum(succ, 0)] - finish,
                                         MIN_GAP_S), 1.0)
    return X, continued, np.log(gap)


def importance(model: NextUseModel, split: Split, signals: SignalTable | None = None, *,
               rng: np.random.Generator, repeats: int = REPEATS) -> Importance:
    """Permutation importance of ``model``'s features on ``split``'s evaluated requests
    (``signals``: the signal table of all ``split.records``, when the caller has it)."""
    if signals is None:
        signals = signal_table(split.records, split.trace, model.models)
    X, continued, log_gap = later_rows(split, signals)
    if len(X) > MAX_ROWS:
        keep = np.linspace(0, len(X) - 1, MAX_ROWS).astype(int)
        X, continued, log_gap = X[keep], continued[keep], log_gap[keep]
    auc = rank = None
    if model.continuation is not None and 0 < continued.sum() < len(X):
        continuation = model.continuation
        auc = lambda Z: _auc(continuation.raw_rows(Z), continued)
    back = continued.nonzero()[0]
    if model.gap_scale is not None and len(back) > 2:
        gap_scale = model.gap_scale
        rank = lambda Z: _rank_correlation(gap_scale.raw_rows(Z[back]), log_gap[back])
    base_auc = auc(X) if auc else None
    base_rank = rank(X) if rank else None
    drops = []
    for j, name in enumerate(FEATURES):
        lost_auc, lost_rank = [], []
        for _ in range(repeats):
            Z = X.copy()
            Z[:, j] = rng.permutation(Z[:, j])
            if auc:
                lost_auc.append(base_auc - auc(Z))
            if rank:
                lost_rank.append(base_rank - rank(Z))
        drops.append(FeatureDrop(name, _mean(lost_auc), _mean(lost_rank)))
    drops.sort(key=lambda d: -max(d.continuation_auc_drop or 0.0, d.gap_rank_drop or 0.0))
    return Importance(len(X), _round(base_auc), _round(base_rank), tuple(drops))


def _auc(score: np.ndarray, label: np.ndarray) -> float:
    """ROC AUC by ranks (ties share their mean rank)."""
    ranks = _ranks(score)
    pos = label.sum()
    return float((ranks[label].sum() - pos * (pos + 1) / 2) / (pos * (len(label) - pos)))


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    # ties: the mean rank of their run
    sorted_x = x[order]
    start = np.r_[0, np.flatnonzero(np.diff(sorted_x)) + 1]
    end = np.r_[start[1:], len(x)]
    mean = (start + end + 1) / 2.0
    ranks[order] = np.repeat(mean, end - start)
    return ranks


def _mean(values: list) -> float | None:
    return round(float(np.mean(values)), 4) if values else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
