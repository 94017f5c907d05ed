"""Fitting the engine model: NNLS recovers a known step cost; the JSON section round-trips
and older parameter files still read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvtier.collector.events import RequestRecord, StepRecord
from kvtier.policy.cost import measured_cost_params
from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits
from kvtier.policy.engine_model.fit import fit_limits, fit_step_cost, fit_step_cost_to_requests
from kvtier.policy.engine_model.params import EngineModelParams, read_engine_params
from kvtier.policy.engine_model.step_cost import StepCost, step_features
from kvtier.policy.engine_model.step_replay import EngineRequests, replay

TRUE = StepCost(overhead_s=0.004, prefill_token_s=2e-5, prefill_request_s=5e-4,
                attention_s=1e-9, decode_request_s=3e-4, decode_context_s=2e-7, cached_token_s=1e-6)


def synthetic_steps(n: int, rng: np.random.Generator, noise_s: float = 0.0) -> list[StepRecord]:
    steps, t = [], 1000.0
    for i in range(n):
        requests = int(rng.integers(0, 4))
        tokens = int(rng.integers(1, 2048)) * (requests > 0)
        decode = int(rng.integers(0, 64))
        context = int(rng.integers(0, 8000)) * (requests > 0)
        step = StepRecord(t, i, None, tokens, requests, context,
                          int(rng.integers(0, context + 1)), decode, decode * int(rng.integers(100, 4000)))
        duration = float(TRUE.seconds(step_features([step]))[0]) + abs(rng.normal(0, noise_s))
        steps.append(_with_duration(step, duration))
        t += duration
    return steps


def _with_duration(step: StepRecord, duration: float) -> StepRecord:
    from dataclasses import replace

    return replace(step, duration_s=duration)


def test_nnls_recovers_the_step_cost_of_synthetic_steps():
    fitted = fit_step_cost(synthetic_steps(400, np.random.default_rng(1)))
    for name, value in TRUE.to_dict().items():
        assert getattr(fitted, name) == pytest.approx(value, rel=1e-6), name


def test_nnls_keeps_coefficients_non_negative_under_noise():
    fitted = fit_step_cost(synthetic_steps(400, np.random.default_rng(2), noise_s=0.002))
    assert (fitted.coefficients >= 0).all()
    assert fitted.prefill_token_s == pytest.approx(TRUE.prefill_token_s, rel=0.1)


def test_steps_without_durations_take_the_gap_to_the_next():
    steps = [_with_duration(s, None) for s in synthetic_steps(50, np.random.default_rng(3))]
    fitted = fit_step_cost(steps)  # the last step has neither and is left out
    assert fitted.overhead_s == pytest.approx(TRUE.overhead_s, rel=1e-6)


def test_too_few_steps_are_refused():
    with pytest.raises(ValueError, match="needs >= 8"):
        fit_step_cost(synthetic_steps(3, np.random.default_rng(4)))


def test_the_search_finds_a_step_cost_that_reproduces_concurrent_requests():
    rng = np.random.default_rng(5)
    n = 120
    arrivals = np.cumsum(rng.exponential(0.03, n))
    prompt = rng.integers(50, 1500, n)
    truth = StepCost(overhead_s=0.003, prefill_token_s=3e-5, decode_request_s=5e-4)
    limits = SchedulerLimits(max_running=8)
    records = [RequestRecord(f"r{i}", float(arrivals[i]), int(prompt[i]), output_tokens=int(o),
                             gpu_hit_tokens=0, cpu_promotion_tokens=0, cold_promotion_tokens=0,
                             recomputed_tokens=int(prompt[i]))
               for i, o in enumerate(rng.integers(2, 30, n))]
    result = replay(EngineRequests.from_records(records), EngineModelParams(truth, limits))
    records = [RequestRecord(**{**{f: getattr(r, f) for f in r.__dataclass_fields__},
                                "ttft_s": float(t), "itl_s": float(i), "e2e_latency_s": float(e)})
               for r, t, i, e in zip(records, result.ttft_s, result.itl_s, result.e2e_s)]
    fitted = fit_step_cost_to_requests(records, EngineModelParams(limits=limits))
    again = replay(EngineRequests.from_records(records), EngineModelParams(fitted, limits))
    assert np.median(again.ttft_s) == pytest.approx(np.median(result.ttft_s), rel=0.1)
    assert np.median(again.itl_s) == pytest.approx(np.median(result.itl_s), rel=0.1)


def test_limits_come_from_step_records_else_from_requests_in_flight():
    steps = [StepRecord(1.0, 0, 0.1, running_requests=3), StepRecord(1.1, 1, 0.1, running_requests=6)]
    assert fit_limits([], steps).max_running == 6
    records = [RequestRecord("a", 0.0, 10, e2e_latency_s=1.0), RequestRecord("b", 0.5, 10, e2e_latency_s=1.0),
               RequestRecord("c", 2.0, 10, e2e_latency_s=1.0)]
    assert fit_limits(records).max_running == 2
    assert fit_limits(records, max_running=16, token_budget=512).token_budget == 512


def test_the_json_section_round_trips_and_old_files_still_read(tmp_path):
    params = EngineModelParams(TRUE, SchedulerLimits(12, 2048, True), kv_bytes_per_token=4096,
                               fitted_from="step_records", admission_delay_s=(0.001, 0.004))
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"probe": "calibrate", "cost_params": {"prefill_tokens_per_s": 9000.0},
                                "engine_model": params.to_dict()}))
    assert read_engine_params(path) == params
    assert measured_cost_params(path).prefill_tokens_per_s.value == 9000.0  # the old reader
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"probe": "calibrate", "cost_params": {"prefill_tokens_per_s": 9000.0}}))
    assert read_engine_params(old) is None


def test_the_admission_delay_is_read_off_arrivals_at_an_idle_engine_and_delays_the_first_step():
    from dataclasses import replace

    from kvtier.policy.engine_model.fit import fit_admission_delay_s

    records, steps = [], []
    for i in range(10):  # each arrives alone at an idle engine, whose next step starts 3 ms later
        arrival = 10.0 + i
        records.append(RequestRecord(f"r{i}", arrival, 10, output_tokens=1, recomputed_tokens=10))
        steps.append(StepRecord(arrival + 0.003, i, 0.010, 10, 1, 0, 0, 0, 0))
    # arriving while a step runs, or behind another in the same idle gap: the wait is not its own
    records += [RequestRecord("busy", 10.008, 10, output_tokens=1, recomputed_tokens=10),
                RequestRecord("behind", 11.001, 10, output_tokens=1, recomputed_tokens=10)]
    assert fit_admission_delay_s(records, steps) == pytest.approx((0.003,) * 41)
    assert fit_admission_delay_s(records[:5], steps[:5]) == ()  # too few to tell
    # where the probe measured each request's hand-off (arrival to the scheduler's intake):
    # at an idle engine all of it is the frontend's ...
    idle = [replace(r, handoff_s=0.002) for r in records[:10]]
    assert fit_admission_delay_s(idle, steps) == pytest.approx((0.002,) * 41)
    # ... behind a running step (an engine takes requests in between steps) the rest of that
    # step is in it too, and the replay waits for its own step: the frontend's share is taken
    # between arrival (the step had begun) and the intake, in the middle
    behind = [RequestRecord(f"b{i}", 10.005 + i, 10, output_tokens=1, recomputed_tokens=10,
                            handoff_s=0.009) for i in range(10)]
    assert fit_admission_delay_s(behind, steps) == pytest.approx((0.0045,) * 41)
    one = EngineRequests.from_records([RequestRecord("a", 0.0, 10, output_tokens=1, recomputed_tokens=10)])
    quiet = replay(one, EngineModelParams(StepCost(overhead_s=0.01)))
    delayed = replay(one, EngineModelParams(StepCost(overhead_s=0.01), admission_delay_s=(0.003, 0.003)))
    assert delayed.ttft_s[0] == pytest.approx(quiet.ttft_s[0] + 0.003)


def test_an_unknown_version_is_named():
    body = EngineModelParams().to_dict() | {"version": 99}
    with pytest.raises(ValueError, match="version 99"):
        EngineModelParams.from_dict(body)


def test_the_noise_is_what_steps_took_beyond_their_cost_and_the_replay_adds_it():
    from kvtier.policy.engine_model.fit import fit_step_noise_s

    steps = synthetic_steps(100, np.random.default_rng(6))
    slow = [_with_duration(s, s.duration_s + 0.005) for s in steps]  # every step 5 ms late
    assert fit_step_noise_s(slow, TRUE) == pytest.approx((0.005,) * 41)
    one = EngineRequests.from_records([RequestRecord("a", 0.0, 10, output_tokens=3, recomputed_tokens=10)])
    quiet = replay(one, EngineModelParams(StepCost(overhead_s=1.0)))
    noisy = replay(one, EngineModelParams(StepCost(overhead_s=1.0), step_noise_s=(0.5, 0.5)))
    assert noisy.ttft_s[0] == pytest.approx(quiet.ttft_s[0] + 0.5)
    assert noisy.e2e_s[0] == pytest.approx(quiet.e2e_s[0] + 3 * 0.5)  # three steps, each late


def test_the_decode_pass_is_told_from_the_overhead_though_few_steps_prefill_alone():
    # under concurrency nearly every step decodes (1-4 requests): 300 decode-only steps, 60
    # that prefill beside decodes, 6 that prefill alone; a third of the steps stall by up
    # to 5 ms. Counted one by one, the fit would fold the decode pass into the overhead
    truth = StepCost(overhead_s=0.0005, prefill_request_s=0.003, decode_pass_s=0.004)
    rng, steps, t = np.random.default_rng(7), [], 1000.0
    kinds = [(0, True)] * 300 + [(1, True)] * 60 + [(1, False)] * 6
    for i in rng.permutation(len(kinds)):
        prefills, decodes = kinds[i][0], int(rng.integers(1, 5)) * kinds[i][1]
        step = StepRecord(t, len(steps), None, 50 * prefills, prefills, 0, 0, decodes, decodes * 100)
        stall = rng.uniform(0, 0.005) if rng.random() < 0.33 else 0.0
        steps.append(_with_duration(step, float(truth.seconds(step_features([step]))[0]) + stall))
        t += steps[-1].duration_s
    fitted = fit_step_cost(steps)
    assert fitted.overhead_s < 0.001
    assert fitted.decode_pass_s == pytest.approx(0.004, abs=0.001)


def test_prefill_steps_and_decode_steps_keep_their_own_noise():
    from kvtier.policy.engine_model.fit import fit_step_noise_s

    steps = synthetic_steps(200, np.random.default_rng(8))
    late = [_with_duration(s, s.duration_s + (0.01 if s.prefill_requests else 0.001)) for s in steps]
    assert fit_step_noise_s(late, TRUE, prefill=True) == pytest.approx((0.01,) * 41)
    assert fit_step_noise_s(late, TRUE, prefill=False) == pytest.approx((0.001,) * 41)
    params = EngineModelParams(step_noise_s=(0.001, 0.001), prefill_step_noise_s=(0.01, 0.02))
    assert EngineModelParams.from_dict(json.loads(json.dumps(params.to_dict()))) == params


def test_prefill_noise_is_kept_apart_by_the_work_a_step_does():
    from kvtier.policy.engine_model.fit import fit_prefill_noise_by_work, fit_step_noise_s

    steps = synthetic_steps(600, np.random.default_rng(9))
    # every prefill step 20% late: a host's stall stretches a long step more than a short one
    late = [_with_duration(s, s.duration_s * (1.2 if s.prefill_requests else 1.0)) for s in steps]
    ranges = fit_prefill_noise_by_work(late, TRUE)
    assert len(ranges) == 3
    assert [work for work, _ in ranges] == sorted(work for work, _ in ranges)
    medians = [float(np.median(noise)) for _, noise in ranges]
    assert medians[0] < medians[1] < medians[2]
    for (up_to, noise), (below, _) in zip(ranges[1:], ranges):  # each range's lateness is its work's
        assert below * 0.2 <= noise[0] and noise[-1] <= up_to * 0.2 + 1e-12
    one = fit_step_noise_s(late, TRUE, prefill=True)
    assert ranges[0][1][-1] < one[-1]  # one distribution gave the short steps the long ones' tail
    assert fit_prefill_noise_by_work(late[:40], TRUE) == ()  # too few steps to split
    params = EngineModelParams(prefill_step_noise_s=one, prefill_noise_by_work=ranges)
    assert EngineModelParams.from_dict(json.loads(json.dumps(params.to_dict()))) == params


def test_a_prefill_step_draws_the_noise_of_its_work():
    ranges = ((0.01, (0.001, 0.001)), (1.0, (0.5, 0.5)))
    short = EngineRequests.from_records([RequestRecord("a", 0.0, 10, output_tokens=1, recomputed_tokens=10)])
    long = EngineRequests.from_records([RequestRecord("b", 0.0, 1000, output_tokens=1, recomputed_tokens=1000)])
    cost = StepCost(prefill_token_s=1e-4)  # 1 ms for the short prompt, 100 ms for the long
    for requests, late in ((short, 0.001), (long, 0.5)):
        quiet = replay(requests, EngineModelParams(cost))
        noisy = replay(requests, EngineModelParams(cost, prefill_step_noise_s=(9.0, 9.0),
                                                   prefill_noise_by_work=ranges))
        assert noisy.ttft_s[0] == pytest.approx(quiet.ttft_s[0] + late)
    beyond = replay(EngineRequests.from_records([RequestRecord("c", 0.0, 20000, output_tokens=1,
                                                               recomputed_tokens=20000)]),
                    EngineModelParams(cost, prefill_noise_by_work=ranges))
    assert beyond.ttft_s[0] == pytest.approx(2.0 + 0.5)  # past the last range: the last range's
    with pytest.raises(ValueError, match="increasing work"):
        EngineModelParams(prefill_noise_by_work=tuple(reversed(ranges)))


def test_the_held_out_prediction_is_the_median_over_noise_draws():
    from kvtier.policy.latency.check import DRAWS, FIELDS, Latencies, predicted_latencies
    from kvtier.policy.latency.models import StepModel

    rows = [RequestRecord(f"r{i}", i * 0.5, 10, output_tokens=3, recomputed_tokens=10) for i in range(30)]
    requests = EngineRequests.from_records(rows)
    params = EngineModelParams(StepCost(overhead_s=0.01), step_noise_s=tuple(np.linspace(0, 0.2, 41)))
    draws = [replay(requests, params, np.random.default_rng(seed)) for seed in range(DRAWS)]
    each = np.array([[getattr(Latencies.of(r.ttft_s, r.itl_s), f) for f in FIELDS] for r in draws])
    predicted, _ = predicted_latencies(StepModel(params), requests)
    assert [getattr(predicted, f) for f in FIELDS] == pytest.approx(np.median(each, axis=0).tolist())
    assert predicted.ttft_p99_s < each[:, 2].max()  # not decided by the worst draw's stall


def test_the_decode_fast_path_equals_stepping_one_decode_step_at_a_time(monkeypatch):
    """``_Run._decode_run`` advances runs of decode-only steps in one go; replacing it by one
    ordinary step at a time must give the same first tokens, ITLs, ends and step count (no
    noise: the fast path draws its noise in one call, stepping draws it step by step)."""
    from kvtier.policy.engine_model import step_replay
    from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits

    rng = np.random.default_rng(7)
    n = 60
    prompt = rng.integers(40, 400, n)
    recompute = np.maximum((prompt * rng.uniform(0.2, 1, n)).astype(np.int64), 1)
    requests = EngineRequests(np.cumsum(rng.exponential(0.02, n)), prompt, rng.integers(1, 40, n),
                              prompt - recompute, np.zeros(n, dtype=np.int64),
                              np.zeros(n, dtype=np.int64), recompute)
    for limits in (SchedulerLimits(4, 256, True), SchedulerLimits(8), SchedulerLimits(3, first_token="own_prefill")):
        params = EngineModelParams(StepCost(0.002, 2e-5, 1e-4, 1e-9, 1e-4, 1e-7, 3e-4), limits)
        fast = replay(requests, params)

        def one_step(run):
            run._step(run.scheduler.schedule())

        with monkeypatch.context() as patch:
            patch.setattr(step_replay._Run, "_decode_run", one_step)
            slow = replay(requests, params)
        assert fast.steps == slow.steps
        for name in ("ttft_s", "itl_s", "e2e_s"):
            assert np.allclose(getattr(fast, name), getattr(slow, name), rtol=1e-9, equal_nan=True), name


def _load_steps(loading: int, rng) -> list[StepRecord]:
    """300 decode steps (4 ms, +-1 ms) and ``loading`` steps that load 1 MiB each, at 2 ms a
    MiB on top, with the same noise."""
    steps, t = [], 0.0
    for i in range(300 + loading):
        loaded = (1 << 20) if i % (300 // max(loading, 1) + 1) == 0 and loading else 0
        duration = 0.004 + 2e-9 * loaded + rng.uniform(-0.001, 0.001)
        steps.append(StepRecord(t, i, duration, 0, 0, 0, 2, 400, running_requests=2,
                                loaded_bytes=loaded))
        t += duration
    return steps


def test_a_cost_fitted_on_few_steps_widens_the_prediction_interval():
    """The step cost refitted on resampled steps travels with the fit; a replay takes one
    per run. Fitted on 3 steps that loaded, a promotion's cost is uncertain, and the TTFT
    interval of requests that promote is wider than fitted on 60 such steps."""
    from kvtier.policy.engine_model.fit import resampled_step_costs
    from kvtier.policy.latency import predict
    from kvtier.policy.latency.models import StepModel

    rng = np.random.default_rng(3)
    n = 80
    promoting = EngineRequests(np.arange(n) * 0.05, np.full(n, 512), np.full(n, 2),
                               np.zeros(n, dtype=np.int64), np.full(n, 480), np.zeros(n, dtype=np.int64),
                               np.full(n, 32))
    widths = {}
    for loading in (3, 60):
        steps = _load_steps(loading, rng)
        cost = fit_step_cost(steps)
        draws = resampled_step_costs(steps)
        assert len(draws) == 8 and all(d != cost for d in draws)
        params = EngineModelParams(cost, SchedulerLimits(4, promotions="load_step"),
                                   kv_bytes_per_token=2048, step_cost_draws=draws)
        samples = predict.draw(StepModel(params), promoting)
        (p50, *_) = predict.levels(samples, np.random.default_rng(0))
        widths[loading] = (p50.high - p50.low) / p50.predicted
    assert widths[3] > 2 * widths[60]
