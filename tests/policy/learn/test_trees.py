"""Exported trees score exactly as scikit-learn does, and survive JSON."""

import json

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

from kvtier.policy.learn.trees import Trees, export


def data(seed=0, n=600):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    X[rng.random((n, 4)) < 0.1] = np.nan  # missing values take the trained side
    y = np.nan_to_num(X[:, 0]) * 2 - np.nan_to_num(X[:, 1]) + rng.normal(size=n) * 0.1
    return X, y


@pytest.mark.parametrize("classify", [False, True])
def test_exported_trees_predict_as_sklearn_after_a_json_round_trip(classify):
    X, y = data()
    if classify:
        model = HistGradientBoostingClassifier(max_iter=30, max_leaf_nodes=7, random_state=0)
        model.fit(X, y > 0)
        expected = model.predict_proba(X)[:, 1]
    else:
        model = HistGradientBoostingRegressor(max_iter=30, max_leaf_nodes=7, random_state=0)
        model.fit(X, y)
        expected = model.predict(X)
    trees = Trees.from_json(json.loads(json.dumps(export(model, ("a", "b", "c", "d")).to_json())))
    got = np.array([trees.predict(row) for row in X.tolist()])
    assert np.allclose(got, expected, rtol=1e-9, atol=1e-12)
    assert trees.kind == ("probability" if classify else "regression")


def test_a_tree_pointing_outside_itself_is_refused():
    bad = {"kind": "regression", "baseline": 0.0, "features": ["a"],
           "trees": [[[0, 0.5, True, 1, 9, 0.0], [-1, 0, True, 0, 0, 1.0]]]}
    with pytest.raises(ValueError, match="points outside"):
        Trees.from_json(bad)
    with pytest.raises(ValueError, match="not a tree model"):
        Trees.from_json({"kind": "regression"})


@pytest.mark.parametrize("classify", [False, True])
def test_the_compiled_forest_gives_sklearns_raw_values_bit_for_bit(classify):
    X, y = data(seed=3, n=5000)
    kind = HistGradientBoostingClassifier if classify else HistGradientBoostingRegressor
    model = kind(max_iter=40, max_leaf_nodes=9, min_samples_leaf=5, random_state=0)
    model.fit(X, y > 0 if classify else y)
    trees = export(model, ("a", "b", "c", "d"))
    got = trees.raw_rows(X)
    assert np.array_equal(got, model._raw_predict(X)[:, 0])  # same comparisons, same sum order
    assert got[:50].tolist() == [trees.raw(row) for row in X[:50].tolist()]
    if classify:
        assert np.array_equal(model._loss.predict_proba(got)[:, 1], model.predict_proba(X)[:, 1])
    with pytest.raises(ValueError, match="rows have 3 features"):
        trees.raw_rows(X[:, :3])


def test_a_compiled_forest_pointing_back_up_its_tree_is_refused():
    from kvtier.policy.learn.kernels import kernels

    with pytest.raises(ValueError, match="back up its tree"):  # a loop would never end
        kernels().Forest([0, -1], [0.5, 0.0], [1, 0], [1, 0], [0, 0], [0.0, 1.0], [0], 0.0, 1)
    with pytest.raises(ValueError, match="starts outside"):
        kernels().Forest([-1], [0.0], [0], [0], [0], [1.0], [3], 0.0, 1)
