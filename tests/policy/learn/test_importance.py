"""Permutation importance of the next-use model on later time."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.policy.learn.split import Split
from kvtier.policy.learn.importance import _auc, importance
from kvtier.policy.learn.nextuse_fit import fit_next_use
from kvtier.policy.learn.request_signals import FEATURES
from tests.policy.learn import traffic


@pytest.fixture(scope="module")
def fitted():
    records = traffic.agentic(sessions=120, seed=0)
    split = Split.by_count(records, 0.5)
    return split, fit_next_use(split.train)


def test_auc_by_ranks_is_sklearns():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    score, label = rng.integers(0, 5, 300).astype(float), rng.random(300) < 0.4
    assert _auc(score, label) == pytest.approx(roc_auc_score(label, score))


def test_the_finish_class_matters_most_on_agentic_traffic_and_unused_signals_not_at_all(fitted):
    split, model = fitted
    result = importance(model, split, rng=np.random.default_rng(0))
    assert result.rows == len(split.records) - split.count_from
    assert result.continuation_auc > 0.7  # the model predicts later time at all
    top = result.features[0]
    # after a tool call the agent comes straight back; after the end of a turn maybe never
    assert top.feature == "finish_class" and top.continuation_auc_drop > 0.1
    used = {node[0] for t in (model.continuation, model.gap_scale) for nodes in t.trees
            for node in nodes if node[0] >= 0}
    for drop in result.features:
        if FEATURES.index(drop.feature) not in used:
            assert drop.continuation_auc_drop == 0 and drop.gap_rank_drop == 0
    assert len(result.features) == len(FEATURES)
