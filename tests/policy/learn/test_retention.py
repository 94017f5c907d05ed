"""Learned retention: the model's score decayed by time since use orders CPU eviction, chains
go from the tail, tau is chosen on the training period."""

from __future__ import annotations

import json
import math

import pytest

from kvtier.policy.learn.compare import compare
from kvtier.policy.learn.split import Split
from kvtier.policy.learn.replay import Tiers
from kvtier.policy.learn.retention import LearnedRetention, choose_tau
from tests.policy.learn.synthetic import conversations, record


def stored(policy, index, rec, keys):
    """Observe ``rec`` as request ``index`` and insert ``keys`` (offers made during it)."""
    policy.observe(index, rec)
    victims = []
    for key in keys:
        victims += policy.insert(key)
    return victims


def test_a_low_score_goes_before_a_high_one_used_at_the_same_time():
    policy = LearnedRetention(2, {(0, 1): 0.9, (0, 2): 0.1, (1, 3): 0.5}, tau_s=100.0)
    stored(policy, 0, record(0, [1], t=0.0), [1])
    stored(policy, 0, record(0, [2], t=0.0), [2])
    assert stored(policy, 1, record(1, [3], t=0.0), [3]) == [2]


def test_recency_outweighs_the_score_as_tau_shrinks():
    scores = {(0, 1): 0.9, (1, 2): 0.3, (2, 3): 0.5}
    for tau, victim in ((1.0, 1), (math.inf, 2)):
        policy = LearnedRetention(2, scores, tau_s=tau)
        stored(policy, 0, record(0, [1], t=0.0), [1])      # old, valuable
        stored(policy, 1, record(1, [2], t=60.0), [2])     # recent, less valuable
        # value p * exp(-(now - last) / tau): with tau 1 s, 60 s of age costs e^-60
        assert stored(policy, 2, record(2, [3], t=61.0), [3]) == [victim], tau


def test_a_chain_is_evicted_from_its_tail():
    # block 1 scores lowest, but its descendants 2 and 3 are resident: 3 (the tail) goes
    scores = {(0, 1): 0.1, (0, 2): 0.8, (0, 3): 0.8, (1, 9): 0.9}
    policy = LearnedRetention(3, scores, tau_s=100.0)
    stored(policy, 0, record(0, [1, 2, 3], t=0.0), [1, 2, 3])
    assert stored(policy, 1, record(1, [9], t=1.0), [9]) == [3]
    assert 1 in policy and 2 in policy


def test_tau_must_be_positive():
    with pytest.raises(ValueError, match="tau_s"):
        LearnedRetention(2, {}, tau_s=0.0)


def test_tau_is_the_best_on_the_training_slice_and_the_row_reports_it():
    records = conversations(900, seed=5, block_tokens=512)
    split = Split.by_time(records, 0.5)
    tiers = Tiers(30, 200)
    out = compare(split, tiers, ["lru", "learned-retention", "belady"])
    info = out["learned"]["learned-retention"]
    sweep = {(math.inf if t is None else t): r for t, r in info["sweep"]}
    chosen = math.inf if info["tau_s"] is None else info["tau_s"]
    assert sweep[chosen] == max(sweep.values())
    json.dumps(out, allow_nan=False)  # no infinity leaks into the JSON
    by = {r["policy"]: r["token_hit_ratio"] for r in out["policies"]}
    assert by["learned-retention"] <= by["belady"] + 1e-12
    # choose_tau on its own agrees with what compare did, given the same scores
    from kvtier.policy.learn.admission_model import ModelConfig
    from kvtier.policy.learn.pipeline import fit

    fitted = fit(split.train, split.records, tiers, ModelConfig(), thresholds=())
    assert choose_tau(split.train, tiers, fitted.scores)[0] == chosen
