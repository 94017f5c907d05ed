"""The reuse analysis: shared prefixes, reuse timing, block sizing, drops, and the verdict."""

import json

import pytest
from tests.policy.sim.simtools import request

from kvtier.policy.cost import CostParams, Param
from kvtier.policy.reuse import analyze, collect, render
from kvtier.policy.reuse.histogram import LogHistogram
from kvtier.policy.reuse.questions import drop_candidates, shared_prefixes


def small_trace():
    return [request([1, 2, 3], t=0.0, rid="a"), request([1, 2, 4], t=5.0, rid="b"),
            request([1, 2, 3], t=65.0, rid="c")]


def test_maximal_shared_prefixes_ranked_by_saved_tokens():
    answer = shared_prefixes(collect(small_trace()))
    top = [(row["block_hash"], row["uses"], row["saved_tokens"]) for row in answer["top"]]
    # block 2 ends a 2-block prefix used 3 times; block 3 a 3-block prefix used twice;
    # block 1 is not maximal (its child 2 is used as often).
    assert top == [(2, 3, 2 * 8), (3, 2, 1 * 12)]
    assert answer["blocks_used_once"] == 1 and answer["distinct_blocks"] == 4


def test_ideal_hit_ratio_is_prefix_contiguous():
    stats = collect([request([1, 2]), request([1, 9, 2])])
    assert stats.ideal_hit_tokens_per_request == [0, 4]   # block 2 after the gap does not count
    assert stats.ideal_token_hit_ratio == pytest.approx(4 / 20)


def test_reuse_timing_since_creation_and_last_use():
    report = analyze(small_trace())
    timing = report["reuse_timing"]
    assert timing["since_creation"]["count"] == 5      # 1, 2 in b; 1, 2, 3 in c
    assert timing["since_last_use"]["p50_s"] == pytest.approx(60.0, rel=0.07)
    assert timing["reused_within"]["10s"] == pytest.approx(2 / 5)


def test_drop_candidates_by_depth():
    records = [request([1, 10 + i, 100 + i]) for i in range(30)]
    answer = drop_candidates(collect(records), drop_below=0.05)
    probability = {row["bucket"]: row["reuse_probability"] for row in answer["by_depth"]}
    assert probability == {"0": 1.0, "1-3": 0.0}
    assert answer["drop_depths"] == ["1-3"]


def test_block_sizing_break_even():
    params = CostParams(cpu_gpu_op_latency_s=Param(1e-3), prefill_tokens_per_s=Param(1000.0))
    sizing = analyze([request([1], block_tokens=16)], params)["block_sizing"]
    cpu = sizing["paths"]["cpu"]
    per_token_move = 131072 / 20e9
    assert cpu["break_even_block_tokens"] == pytest.approx(1e-3 / (1e-3 - per_token_move))
    assert cpu["transfer_wins"] is True  # 16 tokens: 1.1 ms to move vs 16 ms to recompute
    assert sizing["bytes_per_block"] == 16 * 131072


def test_unique_prompts_mean_offloading_is_the_wrong_optimisation():
    records = [request([i, 1000 + i], t=float(i)) for i in range(50)]
    offload = analyze(records)["offloading"]
    assert offload["verdict"] == "do_not_offload"
    assert offload["reasons"][0]["holds"] is True


def test_gpu_that_already_captures_the_reuse_means_no_offload():
    report = analyze(small_trace(), gpu_token_hit_ratio=0.40)
    gpu_reason = report["offloading"]["reasons"][1]
    assert report["shared_prefixes"]["ideal_token_hit_ratio"] == pytest.approx(20 / 36)
    assert gpu_reason["holds"] is False
    assert analyze(small_trace(), gpu_token_hit_ratio=0.55)["offloading"]["verdict"] == "do_not_offload"


def test_worth_trying_when_reuse_outgrows_the_gpu_and_promotions_fit_the_slo():
    report = analyze(small_trace(), gpu_token_hit_ratio=0.1, ttft_slo_s=1.0)
    assert report["offloading"]["verdict"] == "offload"


def test_report_is_json_and_renders(mooncake_path):
    from kvtier.policy.readers import MooncakeReader
    report = analyze(MooncakeReader(mooncake_path).requests())
    assert report["shared_prefixes"]["ideal_token_hit_ratio"] == pytest.approx(0.3736, abs=0.001)
    assert report["shared_prefixes"]["blocks_used_once_fraction"] == pytest.approx(0.758, abs=0.001)
    json.dumps(report)
    text = render(report)
    assert "1. Which prefixes are shared" in text and "Offloading verdict" in text


def test_log_histogram_quantiles():
    histogram = LogHistogram()
    for value in (0.0, 1.0, 1.0, 100.0):
        histogram.add(value)
    assert histogram.quantile(0.25) == pytest.approx(1e-3)
    assert histogram.quantile(0.5) == pytest.approx(1.0, rel=0.07)
    assert histogram.quantile(1.0) == pytest.approx(100.0, rel=0.07)
    assert LogHistogram().quantile(0.5) is None
    with pytest.raises(ValueError, match="q must be in"):
        histogram.quantile(2)


def test_reuse_timing_by_turn_where_the_trace_has_turns():
    from dataclasses import replace
    records = [replace(r, turn=i + 1, session_id="s") for i, r in enumerate(small_trace())]
    by_turn = analyze(records)["reuse_timing"]["since_last_use_by_turn"]
    assert {k: v["count"] for k, v in by_turn.items()} == {"2": 2, "3-5": 3}
    assert analyze(small_trace())["reuse_timing"]["since_last_use_by_turn"] == {}
