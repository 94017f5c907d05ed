"""Cost parameters fitted to measured latencies, and the simulator checked against records:
on synthetic engines whose true parameters the test knows."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from kvtier.collector.events import RequestRecord
from kvtier.policy.calibrate import PromotionJob, calibrate, geometry_for, ran_alone
from kvtier.policy.cost import CostParams, measured_cost_params
from kvtier.policy.engine_check import check_tier_split, check_ttft, replay
from kvtier.policy.sim.config import SimConfig

TRUE = {"overhead_s": 0.004, "prefill_tokens_per_s": 20_000.0, "op_s": 0.0005, "bandwidth": 2e9}


def engine_records(n: int = 60, *, rng: random.Random, noise_s: float = 0.0) -> list[RequestRecord]:
    """Requests one at a time (each ends before the next arrives), TTFT from the true model."""
    records, t = [], 1000.0
    for i in range(n):
        recompute, cpu = rng.randrange(0, 2000), rng.choice([0, 0, 256, 512])
        ttft = (TRUE["overhead_s"] + recompute / TRUE["prefill_tokens_per_s"]
                + (TRUE["op_s"] + cpu * 2048 / TRUE["bandwidth"] if cpu else 0.0)
                + abs(rng.gauss(0, noise_s)))
        records.append(RequestRecord(f"r{i}", t, recompute + cpu + 64, gpu_hit_tokens=64,
                                     cpu_promotion_tokens=cpu, cold_promotion_tokens=0,
                                     recomputed_tokens=recompute, ttft_s=ttft,
                                     e2e_latency_s=ttft + 0.01, block_size_tokens=32))
        t += ttft + 0.05
    return records


def promotion_jobs(rng: random.Random) -> list[PromotionJob]:
    sizes = [rng.randrange(1, 64) * 65536 for _ in range(30)]
    return [PromotionJob("cpu", s, TRUE["op_s"] + s / TRUE["bandwidth"]) for s in sizes]


def test_the_fit_recovers_the_engines_parameters():
    rng = random.Random(1)
    fitted = calibrate(engine_records(rng=rng), promotion_jobs(rng), bytes_per_token=2048)
    p = fitted.params
    assert p.prefill_tokens_per_s.value == pytest.approx(TRUE["prefill_tokens_per_s"], rel=1e-3)
    assert p.request_overhead_s.value == pytest.approx(TRUE["overhead_s"], rel=1e-3)
    assert p.cpu_gpu_op_latency_s.value == pytest.approx(TRUE["op_s"], rel=1e-3)
    assert p.cpu_gpu_bandwidth_bytes_per_s.value == pytest.approx(TRUE["bandwidth"], rel=1e-3)
    assert p.model.bytes_per_token == 2048
    assert p.sources()["cold_cpu_bandwidth_bytes_per_s"] == "default"  # nothing measured it
    assert fitted.fitted().keys() == {"prefill_tokens_per_s", "request_overhead_s",
                                      "cpu_gpu_op_latency_s", "cpu_gpu_bandwidth_bytes_per_s"}


def test_slow_outliers_do_not_drag_the_prefill_fit():
    rng = random.Random(2)
    records = engine_records(rng=rng)
    for i in range(0, len(records), 10):  # a loaded host: every tenth request 200 ms late
        records[i] = dataclasses.replace(records[i], ttft_s=records[i].ttft_s + 0.2)
    p = calibrate(records, promotion_jobs(rng)).params
    assert p.prefill_tokens_per_s.value == pytest.approx(TRUE["prefill_tokens_per_s"], rel=0.02)


def test_the_written_parameters_are_what_simulate_reads():
    rng = random.Random(3)
    fitted = calibrate(engine_records(rng=rng), promotion_jobs(rng), bytes_per_token=2048)
    body = json.loads(fitted.to_json())
    params = measured_cost_params(body, base=CostParams(model=geometry_for(body["kv_bytes_per_token"])))
    assert params.service_s(512, 0, 1000) == pytest.approx(
        TRUE["overhead_s"] + 1000 / TRUE["prefill_tokens_per_s"] + TRUE["op_s"] + 512 * 2048 / TRUE["bandwidth"],
        rel=1e-3)


def test_only_requests_that_ran_alone_are_fitted():
    overlapping = [RequestRecord("a", 0.0, 10, e2e_latency_s=1.0), RequestRecord("b", 0.5, 10, e2e_latency_s=1.0),
                   RequestRecord("c", 2.0, 10, e2e_latency_s=0.5), RequestRecord("d", 3.0, 10)]
    assert ran_alone(overlapping) == [False, False, True, False]  # d: no known end
    with pytest.raises(ValueError, match="ran alone"):
        calibrate([r for r in overlapping if r.request_id != "c"], [])


def test_the_simulator_check_says_which_requests_it_predicted_exactly():
    """Records whose split the simulator itself produced are predicted exactly; a record with
    a different measured split is reported with both."""
    from kvtier.policy.sim.simulator import iter_outcomes

    config = SimConfig(gpu_blocks=4, cpu_blocks=8, semantics="vllm", default_block_tokens=16)
    trace = [RequestRecord(f"q{i}", float(i), 16 * len(ids) + 1, block_hashes=tuple(ids), block_size_tokens=16,
                           e2e_latency_s=0.5, ttft_s=0.1)
             for i, ids in enumerate([[1, 2, 3], [1, 2, 4], [5, 6, 7, 8], [1, 2, 3], [1, 2, 4]])]
    from tests.policy.sim.simtools import measured

    filled = [measured(r, o) for r, o in iter_outcomes(trace, config)]
    check = check_tier_split(replay(filled, config))
    assert (check.exact_requests, check.requests, check.max_share_diff_points) == (5, 5, 0.0)
    assert check.measured_share[1] > 0  # the replay reaches the CPU tier
    wrong = filled[:4] + [dataclasses.replace(filled[4], gpu_hit_tokens=0, cpu_promotion_tokens=0,
                                              recomputed_tokens=filled[4].prompt_tokens)]
    check = check_tier_split(replay(wrong, config))
    assert check.exact_requests == 4 and [d.request_id for d in check.differing] == ["q4"]
    ttft = check_ttft(replay(filled, config), CostParams())
    assert ttft.requests == 5 and ttft.measured_p50_s == pytest.approx(0.1)
