"""Gradient-boosted trees as plain data: trained by scikit-learn, kept and evaluated as JSON.

:func:`export` turns a fitted ``HistGradientBoostingRegressor``/``Classifier`` (numeric
features, one output) into :class:`Trees`: a baseline plus, per tree, flat node lists
(feature, threshold, left, right, value; ``feature`` -1 marks a leaf). :meth:`Trees.raw`
evaluates a row with the standard library only, the same way scikit-learn does (``x <=
threshold`` goes left, a NaN goes where training sent missing values), so the same file
scores blocks in a replay and inside an engine. Nothing is pickled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Trees:
    """``kind``: ``"regression"`` (raw value) or ``"probability"`` (logistic of raw);
    ``trees``: per tree, ``(feature, threshold, nan_left, left, right, value)`` node lists."""

    kind: str
    baseline: float
    trees: tuple[tuple[tuple[int, float, bool, int, int, float], ...], ...]
    features: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind not in ("regression", "probability"):
            raise ValueError(f"kind must be 'regression' or 'probability', got {self.kind!r}")

    def raw(self, row: Sequence[float]) -> float:
        total = self.baseline
        for nodes in self.trees:
            i = 0
            while True:
                feature, threshold, nan_left, left, right, value = nodes[i]
                if feature < 0:
                    total += value
                    break
                x = row[feature]
                i = (left if nan_left else right) if x != x else (
                    left if x <= threshold else right)
        return total

    def predict(self, row: Sequence[float]) -> float:
        return self.link(self.raw(row))

    def link(self, raw: float) -> float:
        """A raw value as the model's output (a probability for ``"probability"``)."""
        if self.kind == "regression":
            return raw
        return 1.0 / (1.0 + math.exp(-raw)) if raw > -700 else 0.0

    def predict_rows(self, X) -> list[float]:
        """:meth:`predict` of each row of ``X`` (rows x features), the trees compiled."""
        return [self.link(raw) for raw in self.raw_rows(X).tolist()]

    def forest(self):
        """The compiled form (the kernels' ``Forest``, built once): every tree over a block of
        rows at a time, the same doubles as :meth:`raw` (imported here, so that reading and
        scoring one row needs the standard library only)."""
        built = self.__dict__.get("_forest")
        if built is None:
            from kvtier.policy.learn.kernels import kernels

            columns: tuple[list, ...] = ([], [], [], [], [], [])
            roots = []
            for nodes in self.trees:
                base = len(columns[0])
                roots.append(base)
                for f, t, n, lo, hi, v in nodes:
                    for column, x in zip(columns, (f, t, n, base + lo, base + hi, v)):
                        column.append(x)
            built = kernels().Forest(*columns, roots, self.baseline, len(self.features))
            object.__setattr__(self, "_forest", built)  # a cache, not a field
        return built

    def raw_rows(self, X):
        """:meth:`raw` of each row of ``X`` (a rows x features float array), compiled."""
        return self.forest().raw(X)

    def to_json(self) -> dict:
        return {"kind": self.kind, "baseline": self.baseline, "features": list(self.features),
                "trees": [[list(node) for node in nodes] for nodes in self.trees]}

    @classmethod
    def from_json(cls, data: dict) -> Trees:
        try:
            trees = tuple(tuple((int(f), float(t), bool(n), int(lo), int(hi), float(v))
                                for f, t, n, lo, hi, v in nodes) for nodes in data["trees"])
            result = cls(str(data["kind"]), float(data["baseline"]), trees,
                         tuple(str(f) for f in data["features"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a tree model: {error}") from None
        for nodes in result.trees:
            for f, _, _, lo, hi, _ in nodes:
                if f >= len(result.features) or (f >= 0 and not (0 < lo < len(nodes)
                                                                  and 0 < hi < len(nodes))):
                    raise ValueError(f"tree node points outside its tree or features: {f}, "
                                     f"{lo}, {hi}")
        return result


def export(estimator, features: Sequence[str]) -> Trees:
    """The fitted scikit-learn histogram GBM ``estimator`` as :class:`Trees`."""
    predictors = estimator._predictors
    if any(len(per_iteration) != 1 for per_iteration in predictors):
        raise ValueError("only single-output models (regression, binary) can be exported")
    trees = []
    for (predictor,) in predictors:
        nodes = []
        for node in predictor.nodes:
            if node["is_categorical"]:
                raise ValueError("categorical splits cannot be exported")
            leaf = bool(node["is_leaf"])
            nodes.append((-1 if leaf else int(node["feature_idx"]),
                          0.0 if leaf else float(node["num_threshold"]),
                          bool(node["missing_go_to_left"]), int(node["left"]),
                          int(node["right"]), float(node["value"]) if leaf else 0.0))
        trees.append(tuple(nodes))
    kind = "probability" if hasattr(estimator, "classes_") else "regression"
    baseline = float(estimator._baseline_prediction.ravel()[0])
    return Trees(kind, baseline, tuple(trees), tuple(features))
