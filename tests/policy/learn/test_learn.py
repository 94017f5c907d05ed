"""Features from the past only, Belady-boundary labels, deterministic models, the admitter."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.policy.learn.features import FEATURES, FeatureTracker
from kvtier.policy.learn.admission_model import ModelConfig, train
from kvtier.policy.learn.offers import collect_offers
from kvtier.policy.learn.pipeline import fit, smoothed_best
from kvtier.policy.learn.replay import IndexedAdmitter, Tiers, replay
from tests.policy.learn.synthetic import conversations, record


def feature(tracker, key, now_s, name):
    return tracker.row(key, now_s)[FEATURES.index(name)]


def test_features_count_reuse_fanout_and_parent_popularity():
    tracker = FeatureTracker()
    tracker.observe(record(0, [1, 2, 3], t=0.0))
    tracker.observe(record(1, [1, 2, 4], t=10.0, turn=2, session_id="s"))
    assert feature(tracker, 2, 12.0, "reuse_count") == 2
    assert feature(tracker, 2, 12.0, "fanout") == 2          # children 3 and 4
    assert feature(tracker, 3, 12.0, "since_last_use_s") == 12.0
    assert feature(tracker, 3, 12.0, "requests_since_last_use") == 2
    assert feature(tracker, 4, 12.0, "parent_reuse_count") == 2
    assert feature(tracker, 4, 12.0, "is_last_block") == 1
    assert feature(tracker, 4, 12.0, "turn") == 2
    assert feature(tracker, 4, 12.0, "request_seen_blocks") == 2  # 1, 2 seen before
    assert feature(tracker, 1, 10.0, "popularity") == pytest.approx(1 + 0.5 ** (10 / 300))


def test_features_infer_the_conversation_turn_from_a_prompt_extended_whole():
    tracker = FeatureTracker()
    tracker.observe(record(0, [1, 2, 3], t=0.0))        # system block 1, then a first turn
    tracker.observe(record(1, [1, 2, 5, 6], t=5.0))     # re-sends 1, 2 (3 was partial): turn 2
    tracker.observe(record(2, [1, 2, 5, 6, 7], t=9.0))  # re-sends all of turn 2: turn 3
    tracker.observe(record(3, [1, 8, 9], t=9.5))        # shares only block 1, which was not the
    assert feature(tracker, 3, 10.0, "chain_depth") == 0  # end of a prompt: a new conversation
    assert feature(tracker, 5, 10.0, "chain_depth") == 2
    assert feature(tracker, 9, 10.0, "chain_depth") == 0
    assert feature(tracker, 7, 10.0, "blocks_to_end") == 0
    assert feature(tracker, 5, 10.0, "blocks_to_end") == 2
    assert feature(tracker, 7, 10.0, "request_new_blocks") == 1   # 7 past the shared 1, 2, 5, 6
    assert feature(tracker, 9, 10.0, "request_new_blocks") == 2


def test_how_a_request_ended_is_read_only_once_it_has():
    from kvtier.collector.events import FINISH_CLASSES
    from kvtier.policy.learn.kernels import kernels
    from kvtier.policy.learn.features import RUNNING

    tracker = FeatureTracker()
    tracker.observe(record(0, [1, 2], t=0.0, finish_status="stopped", stop_reason="tool_use",
                           e2e_latency_s=4.0))
    tracker.observe(record(1, [3], t=1.0))              # the trace does not say
    assert feature(tracker, 2, 3.0, "finish_class") == RUNNING == len(FINISH_CLASSES)
    assert feature(tracker, 2, 4.0, "finish_class") == FINISH_CLASSES.index("tool_use")
    assert feature(tracker, 3, 1.0, "finish_class") == FINISH_CLASSES.index("unknown")
    compiled = kernels().FeatureTracker()                # the compiled tracker's constants
    compiled.py_observe(np.array([0], dtype=np.int32), 0.0, 16, 16, finish_s=5.0)
    assert compiled.py_row(0, 1.0)[FEATURES.index("finish_class")] == RUNNING
    assert compiled.py_row(0, 5.0)[FEATURES.index("finish_class")] == \
        FINISH_CLASSES.index("unknown")


def test_features_do_not_see_unobserved_requests():
    tracker = FeatureTracker()
    tracker.observe(record(0, [1, 2], t=0.0))
    with pytest.raises(KeyError):
        tracker.row(3, 1.0)


def test_labels_mark_blocks_reused_from_cpu_before_belady_evicts_them():
    # GPU and CPU hold one block each: [a] [b] [a] [c]. b evicts a to CPU (offer 1); a is
    # promoted from CPU (label 1) and evicts b to CPU (offer 2); c evicts a (offer 3), and
    # b is never used again (label 0)
    records = [record(0, [10]), record(1, [20]), record(2, [10]), record(3, [30])]
    offers = collect_offers(records, gpu_blocks=1, cpu_blocks=1)
    assert offers.keys.tolist() == [10, 20, 10]
    assert offers.y.tolist() == [1, 0, 0]
    assert offers.request_index.tolist() == [1, 2, 3]


def test_admitting_by_the_labels_reaches_belady_and_beats_lru():
    records = conversations(800, seed=1)
    tiers = Tiers(gpu_blocks=40, cpu_blocks=120)
    offers = collect_offers(records, tiers.gpu_blocks, tiers.cpu_blocks)
    oracle = {(int(i), int(k)): float(y)
              for i, k, y in zip(offers.request_index, offers.keys, offers.y)}
    admitted = replay(records, tiers, "lru", admitter=IndexedAdmitter(oracle, 0.5)).result
    belady = replay(records, tiers, "belady").result
    lru = replay(records, tiers, "lru").result
    assert lru.token_hit_ratio < admitted.token_hit_ratio
    assert admitted.token_hit_ratio == pytest.approx(belady.token_hit_ratio, abs=0.02)


def test_chained_admission_refuses_a_block_whose_parent_no_tier_holds():
    admitter = IndexedAdmitter({(0, 2): 0.9, (0, 3): 0.9}, threshold=0.5)
    admitter.parents = {2: 1, 3: 2}
    admitter.resident = lambda h: h in {2}
    assert not admitter.admit(2, None)   # parent 1 is gone: 2 cannot be reached
    assert admitter.admit(3, None)       # parent 2 is held
    assert IndexedAdmitter({}, 0.5, chained=False).admit(2, None)  # no score: admitted


def test_replay_counts_only_the_window():
    records = conversations(300, seed=2)
    tiers = Tiers(gpu_blocks=30, cpu_blocks=60)
    whole = replay(records, tiers, "lru").result
    later = replay(records, tiers, "lru", count_from=200)
    assert len(later.requests) == 100
    assert later.result.prompt_tokens == sum(r.prompt_tokens for r in records[200:])
    assert 0 < later.result.hit_tokens < whole.hit_tokens


@pytest.mark.parametrize("kind", ["gbm", "logistic"])
def test_training_is_deterministic_given_a_seed(kind):
    offers = collect_offers(conversations(600, seed=3), 30, 90)
    config = ModelConfig(kind=kind, seed=7, max_iter=20)
    a = train(offers.X, offers.y, config).predict(offers.X)
    b = train(offers.X, offers.y, config).predict(offers.X)
    assert np.array_equal(a, b)
    assert ((0 <= a) & (a <= 1)).all()


def test_the_gbm_scores_offers_as_sklearns_own_predict_does():
    offers = collect_offers(conversations(600, seed=3), 30, 90)
    model = train(offers.X, offers.y, ModelConfig(seed=7, max_iter=20))
    prepared = np.log1p(np.maximum(offers.X, 0.0))  # the model's log-scaled features
    sklearn_scores = model._calibrator.predict(model._estimator.predict_proba(prepared)[:, 1])
    assert np.array_equal(model.predict(offers.X), np.clip(sklearn_scores, 0.0, 1.0))


def test_training_refuses_one_class():
    X = np.ones((50, len(FEATURES)))
    with pytest.raises(ValueError, match="both labels"):
        train(X, np.zeros(50))


@pytest.mark.parametrize("bad, match", [({"kind": "forest"}, "gbm, logistic"),
                                        ({"calibration_fraction": 1.0}, "calibration_fraction"),
                                        ({"max_iter": 1}, "max_iter"),
                                        ({"min_samples_leaf": 0}, "min_samples_leaf"),
                                        ({"l2_regularization": -1.0}, "l2_regularization")])
def test_model_config_names_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**bad)


def test_learned_admission_beats_lru_on_later_time():
    records = conversations(1500, seed=4)
    tiers = Tiers(gpu_blocks=40, cpu_blocks=300)
    half = len(records) // 2
    learned = fit(records[:half], records, tiers, ModelConfig(max_iter=30))
    admitter = learned.admitter()
    ours = replay(records, tiers, "lru", admitter=admitter, count_from=half).result
    lru = replay(records, tiers, "lru", count_from=half).result
    assert ours.token_hit_ratio > lru.token_hit_ratio + 0.015
    assert learned.threshold in dict(learned.sweep)
    assert admitter.misses < 0.05 * len(learned.scores)


def test_threshold_pick_prefers_a_plateau_to_a_lone_spike():
    sweep = [(0.1, 0.10), (0.2, 0.30), (0.3, 0.10), (0.4, 0.25), (0.5, 0.26), (0.6, 0.20)]
    assert smoothed_best(sweep) == 0.5
    assert smoothed_best([(0.3, 0.2)]) == 0.3
    assert smoothed_best([(0.2, 0.2), (0.1, 0.2)]) == 0.2   # ties: the higher threshold
