"""The admission model: P(an offered block is reused before it would be evicted).

Two kinds (:data:`KINDS`): ``"gbm"``, a scikit-learn histogram gradient-boosted classifier
whose scores are calibrated by isotonic regression on the latest slice of the training
period (time-ordered, never shuffled), and ``"logistic"``, a logistic regression on
log-scaled, standardised features as the baseline. Training is deterministic given
``ModelConfig.seed``. Nothing is unpickled: a model is re-trained from its config and data,
and :meth:`AdmissionModel.card` is the JSON that records how.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kvtier.policy.learn.features import FEATURES
from kvtier.policy.learn.trees import export

KINDS = ("gbm", "logistic")


@dataclass(frozen=True)
class ModelConfig:
    """How to train. ``calibration_fraction``: the latest share of training rows held out to
    calibrate the gradient-boosted scores (and to measure the held-out quality)."""

    kind: str = "gbm"
    seed: int = 0
    max_iter: int = 50
    learning_rate: float = 0.05
    max_leaf_nodes: int = 7
    min_samples_leaf: int = 200
    l2_regularization: float = 1.0
    calibration_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not 0 < self.calibration_fraction < 1:
            raise ValueError(f"calibration_fraction must be in (0, 1), got "
                             f"{self.calibration_fraction!r}")
        for name in ("max_iter", "max_leaf_nodes"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2, got {getattr(self, name)!r}")
        if self.min_samples_leaf < 1:
            raise ValueError(f"min_samples_leaf must be >= 1, got {self.min_samples_leaf!r}")
        if not self.l2_regularization >= 0:
            raise ValueError(f"l2_regularization must be >= 0, got {self.l2_regularization!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")


class AdmissionModel:
    """A trained model; ``predict(X)`` returns calibrated probabilities in [0, 1]."""

    def __init__(self, config: ModelConfig, estimator, calibrator, held_out: dict) -> None:
        self.config = config
        self._estimator = estimator
        self._calibrator = calibrator
        self.held_out = held_out
        # the trees walked compiled, a row at a time through all of them (scikit-learn's
        # predictor passes over all rows once per tree): the same raw values, several times
        # faster on the millions of offers of a large trace
        self._trees = export(estimator, FEATURES) if config.kind == "gbm" else None

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = _prepare(X)
        if not len(X):
            return np.zeros(0)
        if self._trees is not None:  # the classifier's own link on the same raw values
            raw = self._estimator._loss.predict_proba(self._trees.raw_rows(X))[:, 1]
        else:
            from threadpoolctl import threadpool_limits

            with threadpool_limits(1):
                raw = self._estimator.predict_proba(X)[:, 1]
        if self._calibrator is None:
            return raw
        return np.clip(self._calibrator.predict(raw), 0.0, 1.0)

    def card(self) -> dict:
        """JSON-ready: the config (enough to re-train), the features, held-out quality."""
        return {"config": asdict(self.config), "features": list(FEATURES),
                "held_out": dict(self.held_out)}


def train(X: np.ndarray, y: np.ndarray, config: ModelConfig = ModelConfig()) -> AdmissionModel:
    """Train on rows in time order; the last ``calibration_fraction`` is held out.
    ``ValueError`` when the rows are too few or hold one class only."""
    raw_X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=int)
    X = _prepare(raw_X)
    split = int(len(y) * (1 - config.calibration_fraction))
    if split < 10 or len(y) - split < 10 or len(set(y[:split].tolist())) < 2:
        raise ValueError(f"training needs >= 10 rows on each side of the calibration split "
                         f"and both labels before it; got {len(y)} rows, "
                         f"{int(y.sum())} positive")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # one thread: the host is shared, and results stay identical
        estimator = _estimator(config).fit(X[:split], y[:split])
    calibrator = None
    if config.kind == "gbm":
        from sklearn.isotonic import IsotonicRegression

        raw = estimator.predict_proba(X[split:])[:, 1]
        calibrator = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0)
        calibrator.fit(raw, y[split:])
    model = AdmissionModel(config, estimator, calibrator, {})
    model.held_out = quality(model.predict(raw_X[split:]), y[split:])
    return model


def quality(p: np.ndarray, y: np.ndarray) -> dict:
    """Held-out rows, positive rate, ROC AUC (None with one class) and Brier score."""
    from sklearn.metrics import brier_score_loss, roc_auc_score

    y = np.asarray(y, dtype=int)
    auc = float(roc_auc_score(y, p)) if len(set(y.tolist())) == 2 else None
    return {"rows": len(y), "positive_rate": float(y.mean()) if len(y) else 0.0,
            "roc_auc": auc, "brier": float(brier_score_loss(y, p)) if len(y) else None}


def _estimator(config: ModelConfig):
    if config.kind == "gbm":
        from sklearn.ensemble import HistGradientBoostingClassifier

        return HistGradientBoostingClassifier(
            max_iter=config.max_iter, learning_rate=config.learning_rate,
            max_leaf_nodes=config.max_leaf_nodes, min_samples_leaf=config.min_samples_leaf,
            l2_regularization=config.l2_regularization, early_stopping=False,
            random_state=config.seed)
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000,
                                                              random_state=config.seed))


def _prepare(X: np.ndarray) -> np.ndarray:
    # counts and durations are heavy-tailed: log scale helps the linear baseline, and is
    # monotone, so the trees split the same way
    X = np.maximum(np.asarray(X, dtype=float).reshape(-1, len(FEATURES)), 0.0)
    return np.log1p(X, out=X)
