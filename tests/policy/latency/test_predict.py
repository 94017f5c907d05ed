"""The one prediction function: the statistic the engine measures, its interval, and a
change paired on the same requests."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.policy.latency import predict


def samples(rows, evaluate_from: int = 0) -> predict.Samples:
    return predict.Samples(np.asarray(rows, dtype=float), evaluate_from)


def test_the_point_is_the_median_over_draws_of_the_period_percentile_of_the_evaluated():
    # three draws of 6 requests; the first 2 warm the tiers and are not counted
    rows = [[9, 9, 1, 2, 3, 4], [9, 9, 2, 3, 4, 5], [9, 9, 3, 4, 5, 6]]
    (p50, *_) = predict.levels(samples(rows, 2), np.random.default_rng(0))
    assert p50.metric == "ttft_p50_s"
    assert p50.predicted == pytest.approx(np.median([2.5, 3.5, 4.5]))
    assert p50.low <= p50.predicted <= p50.high and p50.high < 9


def test_one_draw_of_identical_requests_has_no_spread_and_more_requests_narrow_it():
    flat = predict.levels(samples([[0.1] * 50]), np.random.default_rng(0))
    assert all(lv.low == lv.predicted == lv.high == pytest.approx(0.1) for lv in flat)
    rng = np.random.default_rng(1)
    few, many = (predict.levels(samples([rng.exponential(0.05, n)]), np.random.default_rng(2))[0]
                 for n in (40, 4000))
    assert (many.high - many.low) < 0.3 * (few.high - few.low)


def test_a_change_is_paired_on_the_same_requests():
    """The candidate serves every request 10 ms sooner: the change is -10 ms whichever
    requests a resample takes, though the levels themselves spread widely."""
    rng = np.random.default_rng(3)
    base = rng.exponential(0.1, (1, 300))
    for p in predict.paired(samples(base), samples(base - 0.010), np.random.default_rng(4)):
        assert p.change.predicted == pytest.approx(-0.010)
        assert p.change.low == pytest.approx(-0.010) and p.change.high == pytest.approx(-0.010)
        assert p.baseline.high - p.baseline.low > 0.01
    with pytest.raises(ValueError, match="the same requests"):
        predict.paired(samples(base), samples(base[:, :10]), np.random.default_rng(0))


def test_noise_draws_widen_the_interval():
    rng = np.random.default_rng(5)
    requests = rng.exponential(0.05, 200)
    quiet = predict.levels(samples([requests]), np.random.default_rng(0))[1]
    noisy = predict.levels(samples([requests * rng.uniform(0.7, 1.3) for _ in range(20)]),
                           np.random.default_rng(0))[1]
    assert noisy.high - noisy.low > quiet.high - quiet.low


def test_the_models_own_held_out_error_widens_levels_and_scales_a_paired_change_alike():
    """A model that missed by a factor on held-out requests carries that miss into its
    intervals; in a change both sides take the same draw of it, so the change widens in
    proportion, not as two independent misses would."""
    from kvtier.policy.engine_model.params import EngineModelParams
    from kvtier.policy.engine_model.step_cost import StepCost
    from kvtier.policy.engine_model.step_replay import EngineRequests
    from kvtier.policy.latency.check import PRIOR_LOG_SD, model_error_log_sd
    from kvtier.policy.latency.models import StepModel

    n = 60
    base = EngineRequests(np.arange(n) * 0.05, np.full(n, 400), np.full(n, 2), np.zeros(n, dtype=np.int64),
                          np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.full(n, 400))
    cand = EngineRequests(base.arrival_s, base.prompt_tokens, base.output_tokens,
                          np.full(n, 300), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                          np.full(n, 100))
    widths = {}
    for sd in (0.0, 0.3):
        model = StepModel(EngineModelParams(StepCost(0.001, 2e-5), model_error_log_sd=sd))
        paired = predict.paired(predict.draw(model, base), predict.draw(model, cand),
                                np.random.default_rng(0))[0]
        widths[sd] = paired
    exact, missed = widths[0.0], widths[0.3]
    assert exact.baseline.low == exact.baseline.high  # no noise, identical requests: no spread
    assert missed.baseline.high / missed.baseline.low > 1.5
    # the change scales with the same factor: its relative width equals the level's
    change_spread = (missed.change.high - missed.change.low) / abs(missed.change.predicted)
    level_spread = (missed.baseline.high - missed.baseline.low) / missed.baseline.predicted
    assert change_spread == pytest.approx(level_spread, rel=0.25)
    # a check's ratios pooled with the prior: one exact split does not claim a perfect model
    check = {"ratio": {"ttft_p50_s": 1.0, "ttft_p95_s": 1.0, "ttft_p99_s": 1.0}}
    assert 0 < model_error_log_sd([check]) < PRIOR_LOG_SD
    far = {"ratio": {"ttft_p50_s": 2.0, "ttft_p95_s": 2.0, "ttft_p99_s": 2.0}}
    assert model_error_log_sd([far] * 4) > PRIOR_LOG_SD
