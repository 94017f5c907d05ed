"""Geometry, capacity parsing, the cost model and the queueing estimate."""

import math

import pytest
from tests.policy.sim.simtools import request

from kvtier.policy.cost import CostParams, Param, measured_cost_params, parse_servers, queue_ttft, servers_for
from kvtier.policy.geometry import KVGeometry, geometry, parse_capacity_tokens
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.whatif import what_if

LLAMA8B = geometry("llama-3.1-8b")


def test_llama_8b_kv_is_128_kib_per_token():
    assert LLAMA8B.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert LLAMA8B.block_bytes(16) == 2 * 2**20


@pytest.mark.parametrize("text, tokens", [
    ("4e6", 4_000_000), ("10M", 10_000_000), ("2.5k", 2500), ("123", 123), ("inf", math.inf),
    ("16GiB", 16 * 2**30 // 131072), ("1GB", 1_000_000_000 // 131072),
])
def test_capacity_parsing(text, tokens):
    assert parse_capacity_tokens(text, LLAMA8B) == tokens


@pytest.mark.parametrize("text, message", [
    ("lots", "bad capacity 'lots'"), ("10Q", "bad capacity suffix 'Q'"),
    ("16GiB", "is in bytes; give a model geometry"),
])
def test_capacity_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_capacity_tokens(text)


def test_geometry_validation_and_lookup():
    with pytest.raises(ValueError, match="kv_heads must be a positive int, got 0"):
        KVGeometry("x", layers=1, kv_heads=0, head_dim=1)
    with pytest.raises(ValueError, match="unknown model geometry 'gpt-9'; known: llama-3.1-8b"):
        geometry("gpt-9")


def test_promotion_is_latency_plus_bytes_over_bandwidth():
    params = CostParams(cpu_gpu_bandwidth_bytes_per_s=Param(1e9), cpu_gpu_op_latency_s=Param(1e-3),
                        cold_cpu_bandwidth_bytes_per_s=Param(1e8), cold_cpu_op_latency_s=Param(1e-2),
                        prefill_tokens_per_s=Param(1000.0, source="measured"))
    tokens = 1000  # 131,072,000 bytes
    assert params.promotion_s(tokens, "cpu") == pytest.approx(1e-3 + 0.131072)
    assert params.promotion_s(tokens, "cold") == pytest.approx(1e-3 + 0.131072 + 1e-2 + 1.31072)
    assert params.promotion_s(0, "cold") == 0.0
    assert params.recompute_s(500) == pytest.approx(0.5)
    assert params.sources()["prefill_tokens_per_s"] == "measured"
    assert params.sources()["cpu_gpu_op_latency_s"] == "default"


def test_param_validation():
    with pytest.raises(ValueError, match="source must be one of measured, calibrated, default, got 'guess'"):
        Param(1.0, source="guess")
    for bad in (0, -1.0, float("inf"), float("nan"), "5"):
        with pytest.raises(ValueError, match="must be a finite number > 0, got"):
            Param(bad)


@pytest.mark.parametrize("value", [float("inf"), -2.0, 0, "1e9", None, True])
def test_a_measured_parameter_file_names_the_bad_key(value):
    with pytest.raises(ValueError, match=f"cost parameter prefill_tokens_per_s must be a finite number > 0, got {value!r}"):
        measured_cost_params({"probe": "calibrate", "cost_params": {"prefill_tokens_per_s": value}})


def test_queue_delays_requests_that_arrive_while_the_server_is_busy():
    estimate = queue_ttft([0.0, 0.0, 10.0], [2.0, 2.0, 1.0])
    # first waits 0 (2 s), second waits 2 (4 s), third finds the server idle (1 s)
    assert estimate.p50_s == pytest.approx(2.0)
    assert estimate.mean_s == pytest.approx(7.0 / 3)
    assert estimate.p99_s == pytest.approx(4.0, abs=0.05)


def test_queue_rejects_unsorted_arrivals():
    with pytest.raises(ValueError, match="non-decreasing"):
        queue_ttft([1.0, 0.0], [1.0, 1.0])


def test_what_if_prices_hits_below_recompute():
    records = [request([1, 2, 3, 4], block_tokens=256, t=float(i)) for i in range(5)]
    cached = what_if(records, SimConfig(gpu_blocks=None))
    uncached = what_if(records, SimConfig(gpu_blocks=0))
    assert cached.result.gpu_hit_tokens == 4 * 1024
    assert cached.ttft.p50_s == 0.0 and uncached.ttft.p50_s == pytest.approx(1024 / 8000)
    assert cached.ttft.parameter_sources["prefill_tokens_per_s"] == "default"
    compressed = what_if(records, SimConfig(gpu_blocks=0), time_scale=0.01)
    assert compressed.ttft.p99_s > uncached.ttft.p99_s  # more load, more queueing


def test_two_servers_serve_a_burst_in_parallel():
    one = queue_ttft([0.0, 0.0, 0.0, 0.0], [1.0] * 4, servers=1)
    two = queue_ttft([0.0, 0.0, 0.0, 0.0], [1.0] * 4, servers=2)
    assert one.mean_s == pytest.approx(2.5) and two.mean_s == pytest.approx(1.5)
    with pytest.raises(ValueError, match="servers must be an int >= 1, got 0"):
        queue_ttft([0.0], [1.0], servers=0)


def test_auto_servers_keep_the_cold_cache_queue_bounded():
    params = CostParams(prefill_tokens_per_s=Param(1000.0))
    # 11 requests of 1,000 tokens over 10 s: 11 s of prefill work in a 10 s span
    records = [request([i], prompt_tokens=1000, t=float(i)) for i in range(11)]
    servers = servers_for(records, params)
    assert servers == 2  # 11 / (10 x 0.8) = 1.375 -> 2
    services = [params.recompute_s(r.prompt_tokens) for r in records]
    arrivals = [r.arrival_s for r in records]
    assert queue_ttft(arrivals, services, servers=servers).utilisation <= 0.8
    assert queue_ttft(arrivals, services, servers=servers - 1).utilisation > 1
    assert servers_for(records, params, utilisation=0.5) == 3
    assert servers_for(records[:1], params) == 1


def test_auto_servers_size_for_the_busiest_window_not_the_mean():
    params = CostParams(prefill_tokens_per_s=Param(1000.0))
    # 1,000 s of prefill work arriving in 100 s, then one request a day later: the mean over
    # the span needs one server, the busiest ten minutes three (1,000 / (600 x 0.8) = 2.08)
    records = [request([i], prompt_tokens=1000, t=i / 10) for i in range(1000)]
    records.append(request([1000], prompt_tokens=1000, t=86_400.0))
    assert math.ceil(1001 / (86_400 * 0.8)) == 1
    servers = servers_for(records, params)
    assert servers == 3
    services = [params.recompute_s(r.prompt_tokens) for r in records]
    arrivals = [r.arrival_s for r in records]
    # one server queues the burst for minutes; the sized ones keep it under the burst's length
    assert queue_ttft(arrivals, services, servers=1).p50_s > 400
    assert queue_ttft(arrivals, services, servers=servers).p50_s < 300
    assert servers_for(records, params, window_s=86_400.0) == 1
    with pytest.raises(ValueError, match="window_s must be > 0, got 0"):
        servers_for(records, params, window_s=0)


@pytest.mark.parametrize(("text", "value"), [("auto", None), ("AUTO", None), ("3", 3)])
def test_parse_servers(text, value):
    assert parse_servers(text) == value


@pytest.mark.parametrize("text", ["0", "-2", "many", "1.5"])
def test_parse_servers_rejects(text):
    with pytest.raises(ValueError, match="'auto' or an int >= 1"):
        parse_servers(text)


def test_prefill_seconds_grow_with_the_position_of_the_recomputed_tokens():
    from kvtier.policy.cost import CostParams

    params = CostParams()
    head, tail = params.prefill_s(0, 1024), params.prefill_s(60_000, 1024)
    assert params.recompute_s(1024) < head < tail  # attention makes deep tokens dearer
    # at the position where attention equals the rest, a token costs twice the linear rate
    equal = params.attention_equal_tokens.value
    assert params.prefill_s(int(equal) - 1, 2) == pytest.approx(2 * params.recompute_s(2), rel=1e-3)
    assert params.prefill_s(100, 0) == 0.0


@pytest.mark.parametrize("scale", [0, -1.0, float("inf"), float("nan")])
def test_what_if_refuses_a_time_scale_that_is_not_finite_and_positive(scale):
    from kvtier.policy.sim.config import SimConfig
    from kvtier.policy.whatif import what_if

    with pytest.raises(ValueError, match="time_scale must be a finite number > 0"):
        what_if([], SimConfig(gpu_blocks=1), time_scale=scale)
