"""Tier sizes from the curve: the knee, the caps, the report, and one verdict with analyze."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from kvtier.verbs import analyze as analyze_verb
from kvtier.verbs import recommend as recommend_verb
from kvtier.policy.cost import CostParams
from kvtier.policy.curves import HitRatioCurve, lru_curve
from kvtier.policy.recommend import report
from kvtier.policy.recommend.build import Inputs, recommend
from kvtier.policy.recommend.headroom import HostLimit
from kvtier.policy.recommend.recommendation import from_json
from kvtier.policy.recommend.sizing import GIB, cold_free_cap, tier_size
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.simulator import simulate
from tests.policy.learn.synthetic import conversations
from tests.policy.learn.test_evaluate import write_mooncake

MIB = 1 << 20


def steps(points: dict[int, int], prompt: int = 10_000) -> HitRatioCurve:
    """A curve from {capacity in blocks: cumulative hit tokens}."""
    caps = np.asarray(sorted(points), dtype=np.int64)
    hits = np.asarray([points[c] for c in caps.tolist()], dtype=np.int64)
    return HitRatioCurve(caps, hits, hits // 16, prompt, prompt // 16)


def size(curve, **overrides):
    # 1 MiB blocks, so a GiB is 1024 blocks; 1 s of prefill saved per token over a 1000 s span:
    # each token the next GiB adds frees 0.1% of a server
    args = dict(tier="cpu", offset_blocks=100, block_bytes=MIB, saved_s_per_token=1.0,
                span_s=1000.0, threshold_per_gib=0.005)
    return tier_size(curve, **{**args, **overrides})


def test_the_knee_is_where_the_next_gib_frees_less_than_the_threshold():
    # above the GPU's 100 blocks: +20 tokens at 200, +10 at 1500, +2 at 3000 (per GiB window)
    curve = steps({50: 100, 100: 200, 200: 220, 1500: 230, 3000: 232})
    result = size(curve)
    # from 0 the next GiB adds 20 tokens (2% of a server > 0.5%); from 376 on it reaches the
    # step at 1500 (+10 tokens, 1%) until 1400 takes it; past 1400 only +2 tokens remain
    assert result.knee_bytes == 1400 * MIB and result.chosen_bytes == result.knee_bytes
    assert result.gain_per_gib_at_chosen < result.threshold_per_gib
    assert result.token_hit_ratio_without == pytest.approx(0.02)
    assert result.token_hit_ratio_at_chosen == pytest.approx(0.023)
    assert "knee of the LRU curve" in result.reason and "not capped" in result.reason


def test_a_rise_after_a_flat_stretch_is_not_missed():
    # flat for three GiB after 1 GiB, then a big step: the knee must reach it
    curve = steps({100: 0, 500: 50, 5000: 5000})
    assert size(curve).knee_bytes == 4900 * MIB


def test_no_size_when_no_gib_pays_or_a_promotion_costs_more_than_recomputing():
    curve = steps({100: 0, 200: 3})
    flat = size(curve)
    assert flat.chosen_bytes == 0 and "no GiB of it frees" in flat.reason
    costly = size(steps({100: 0, 200: 5000}), saved_s_per_token=-1e-6)
    assert costly.chosen_bytes == 0 and "costs at least as much as recomputing" in costly.reason


def test_the_size_never_exceeds_its_cap_and_says_so():
    curve = steps({100: 0, 3000: 9000})
    capped = size(curve, cap_bytes=1000 * MIB + 123, cap_source="host headroom: probe")
    assert capped.knee_bytes == 2900 * MIB and capped.chosen_bytes == 1000 * MIB
    assert capped.capped and capped.chosen_bytes <= capped.cap_bytes
    assert "capped at 1e+03 MiB (host headroom: probe)" in capped.reason
    given = size(curve, given_blocks=50)
    assert given.chosen_bytes == 50 * MIB and given.reason.startswith("given: 50 MiB")


def test_the_curve_above_the_gpu_is_the_simulated_gpu_plus_cpu_hierarchy():
    records = conversations(600, seed=4)
    curve = lru_curve(records, 16)
    for cpu in (0, 40, 120, 400):
        replayed = simulate(records, SimConfig(gpu_blocks=30, cpu_blocks=cpu, policy="lru",
                                               default_block_tokens=16)).token_hit_ratio
        assert curve.token_hit_ratio(30 + cpu) == pytest.approx(replayed, abs=0.01)


def test_the_cold_cap_is_free_space_less_a_margin(tmp_path):
    import shutil

    cap, source = cold_free_cap(str(tmp_path / "not" / "yet"))  # its nearest existing parent
    free = shutil.disk_usage(tmp_path).free
    assert abs(cap - max(free - max(free // 10, GIB), 0)) < 64 * MIB  # others write meanwhile
    assert str(tmp_path) in source


@pytest.fixture(scope="module")
def sized():
    records = conversations(900, seed=8, block_tokens=512)
    limit = HostLimit(40 * 512 * CostParams().model.bytes_per_token, 0, "test probe")
    return records, recommend(records, Inputs(30, prefill_servers=4, host=limit, cold_blocks=None))


def test_recommend_sizes_the_cpu_tier_from_the_curve_within_the_host_cap(sized, tmp_path):
    _, rec = sized
    cpu = rec.evidence.size("cpu")
    assert cpu.knee_bytes > cpu.chosen_bytes == rec.settings.cpu_tier_bytes <= cpu.cap_bytes
    assert rec.knob("cpu_tier_bytes").value == cpu.chosen_bytes
    assert rec.evidence.host_memory.capped and rec.evidence.tiers_blocks.cpu == cpu.chosen_blocks
    cold = rec.evidence.size("cold")
    assert cold is not None and cold.cap_bytes is None  # no --cold-path: decided, not capped
    written = report.write(rec, tmp_path, ("vllm",))
    text = (tmp_path / "report.md").read_text()
    assert "## Tier sizes from the curve" in text and "next GiB frees" in text
    assert "## Expected change against the GPU tier alone" in text and "recompute_tokens" in text
    assert "No TTFT is promised" in text  # a trace priced by default costs
    assert (tmp_path / "cpu_tier_curve.png") in written
    assert from_json(json.loads((tmp_path / "recommendation.json").read_text())) == rec


def test_against_the_gpu_alone_the_cpu_tier_cuts_recompute(sized):
    _, rec = sized
    by = {c.metric: c for c in rec.evidence.expected_vs_gpu_only}
    assert by["recompute_tokens"].change < 0 and by["recompute_tokens"].high < 0
    assert by["cpu_promotion_tokens"].change > 0


def run(verb, argv):
    parser = argparse.ArgumentParser()
    verb.add_arguments(parser)
    return verb.run(parser.parse_args(argv))


def test_analyze_and_recommend_give_one_verdict_on_the_same_inputs(tmp_path, capsys):
    trace = write_mooncake(tmp_path / "t.jsonl", conversations(700, seed=8, block_tokens=512))
    headroom = tmp_path / "headroom.json"
    available = 64 * 2**30
    headroom.write_text(json.dumps({"probe": "headroom", "available_bytes": available,
                                    "margin_bytes": 2**30, "reserve_bytes": 0,
                                    "safe_bytes": available - 2**30, "limited_by": "host"}))
    same = ["--trace", str(trace), "--gpu-tokens", str(30 * 512), "--ttft-slo-s", "2"]
    run(analyze_verb, [*same, "--headroom-json", str(headroom), "--json"])
    analysed = json.loads(capsys.readouterr().out)["offloading"]
    run(recommend_verb, [*same, "--headroom-json", str(headroom), "--prefill-servers", "4",
                         "--out", str(tmp_path / "r")])
    said = capsys.readouterr().out
    doc = json.loads((tmp_path / "r" / "recommendation.json").read_text())
    assert analysed["verdict"] == doc["evidence"]["verdict"] == "offload"
    assert "note" not in doc["evidence"] and said.startswith("verdict: offload\n")
    # without the budget and the headroom analyze cannot tell; recommend says why it can
    run(analyze_verb, ["--trace", str(trace), "--gpu-tokens", str(30 * 512), "--json"])
    assert json.loads(capsys.readouterr().out)["offloading"]["verdict"] == "inconclusive"
    run(recommend_verb, ["--trace", str(trace), "--gpu-tokens", str(30 * 512),
                         "--prefill-servers", "4", "--out", str(tmp_path / "r2")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "verdict: offload" and "inconclusive" in lines[1]
    assert "'the tail TTFT budget is too tight for promotions'" in lines[1]
