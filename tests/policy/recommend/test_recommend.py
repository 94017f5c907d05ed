"""`kvtier recommend`: verdicts, reproducibility, push-readable JSON, configs and report."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from kvtier.errors import KvtierError
from kvtier.verbs import recommend as verb
from kvtier.policy.cost import CostParams
from kvtier.policy.learn.replay import Tiers, replay
from kvtier.policy.recommend.build import Inputs, recommend
from kvtier.policy.recommend.expected import expected_changes
from kvtier.policy.recommend.sweep import sweep
from kvtier.policy.recommend.value import full_block_value, priorities, value_per_byte
from kvtier.policy.writers.push import load_recommendation
from kvtier.policy.writers.yamledit import yaml_get
from tests.policy.learn.synthetic import conversations, record
from tests.policy.learn.test_evaluate import write_mooncake


def run_verb(argv):
    parser = argparse.ArgumentParser()
    verb.add_arguments(parser)
    return verb.run(parser.parse_args(argv))


@pytest.fixture(scope="module")
def reco_dir(tmp_path_factory):
    trace = write_mooncake(tmp_path_factory.mktemp("t") / "t.jsonl",
                           conversations(900, seed=8, block_tokens=512))
    out = tmp_path_factory.mktemp("reco")
    args = ["--trace", str(trace), "--gpu-tokens", str(30 * 512), "--cpu-tokens",
            str(200 * 512), "--prefill-servers", "4", "--seed", "3",
            "--host-headroom-bytes", str(1 << 40)]  # not this machine's memory: the same everywhere
    assert run_verb([*args, "--out", str(out / "a")]) == 0
    assert run_verb([*args, "--out", str(out / "b")]) == 0
    return out


def test_recommend_writes_push_readable_json_configs_and_report(reco_dir):
    out = reco_dir / "a"
    settings = load_recommendation(out / "recommendation.json").settings
    assert settings.cpu_tier_bytes == 200 * 512 * CostParams().model.bytes_per_token
    trt = load_recommendation(out / "recommendation.trtllm.json", "trtllm").settings
    assert 0 <= trt.offload_min_priority <= 100
    # the neutral file carries the engine's settings too; a per-engine file is only its own
    assert load_recommendation(out / "recommendation.json", "trtllm").settings == trt
    with pytest.raises(ValueError, match="holds the trtllm settings, not vllm's"):
        load_recommendation(out / "recommendation.trtllm.json", "vllm")
    bands = json.loads((out / "recommendation.json").read_text())["evidence"]
    assert {"tokens_0_512", "tokens_8192_end"} <= bands["token_range_priorities"].keys()
    assert "secondary_offload_min_priority" in (out / "trtllm.yaml").read_text()
    for name in ("vllm.json", "dynamo.env", "lmcache.yaml", "report.md",
                 "threshold_sweep.png", "hit_ratio.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "threshold_sweep.png").read_bytes()[:4] == b"\x89PNG"
    report = (out / "report.md").read_text()
    assert "Verdict: offload" in report and "No TTFT is promised" in report  # default costs
    evidence = json.loads((out / "recommendation.json").read_text())["evidence"]
    assert {c["metric"] for c in evidence["expected"]} >= {"recompute_tokens"}
    assert not {c["metric"] for c in evidence["expected"]} & {"ttft_p99_s"}
    for change in evidence["expected"]:
        assert change["low"] <= change["change"] <= change["high"]


def test_same_input_and_seed_give_the_same_recommendation(reco_dir):
    a = (reco_dir / "a" / "recommendation.json").read_text()
    assert a == (reco_dir / "b" / "recommendation.json").read_text()


def test_unique_prompts_get_the_do_not_offload_verdict():
    records = [record(i, [1000 * i + j for j in range(4)]) for i in range(200)]
    rec = recommend(records, Inputs(gpu_blocks=50, cpu_blocks=200))
    assert rec.verdict.outcome == "do_not_offload"
    assert any("prompts are unique" in r.name for r in rec.verdict.reasons if r.holds)
    assert rec.settings.cpu_tier_bytes == 0


def test_a_gpu_that_holds_the_working_set_is_not_the_limit():
    records = [record(i, [1, 2, 3, 10 + i % 5]) for i in range(200)]
    rec = recommend(records, Inputs(gpu_blocks=1000, cpu_blocks=200))
    assert rec.verdict.outcome == "do_not_offload"
    assert any("GPU memory is not the limit" in r.name for r in rec.verdict.reasons if r.holds)


def test_verb_refuses_both_or_neither_source():
    with pytest.raises(KvtierError, match="exactly one"):
        run_verb(["--out", "/tmp/x"])


def test_priorities_are_monotone_quantised_and_floor_at_zero():
    params = CostParams()
    top = full_block_value(512, params)
    p = np.asarray([0.0, 0.26, 0.5, 0.94, 1.0])
    prio = priorities(value_per_byte(p, np.full(5, 512), params), top)
    assert prio.tolist() == [0, 30, 50, 90, 100]
    assert priorities(np.asarray([-1.0]), top).tolist() == [0]
    with pytest.raises(ValueError, match="step must divide 100"):
        priorities(p, top, step=7)


def test_gt_points_derived_from_ge_match_a_replay():
    records = conversations(400, seed=9)
    tiers = Tiers(30, 120)
    rng = np.random.default_rng(0)
    from kvtier.policy.learn.offers import collect_offers

    offers = collect_offers(records, 30, 120, label=False)
    prio = {(int(i), int(k)): int(rng.integers(0, 11)) * 10
            for i, k in zip(offers.request_index, offers.keys)}
    derived = {(p.min_priority, p.comparison): p.token_hit_ratio
               for p in sweep(records, tiers, prio, 200, thresholds=(20, 30))}
    replayed = sweep(records, tiers, prio, 200, thresholds=(20,), comparisons=("gt",))
    assert derived[(20, "gt")] == replayed[0].token_hit_ratio == derived[(30, "ge")]


def test_identical_replays_change_nothing_and_the_bootstrap_is_seeded():
    records = conversations(300, seed=10)
    a = replay(records, Tiers(30, 100), "lru", count_from=100)
    b = replay(records, Tiers(30, 100), "belady", count_from=100)
    from kvtier.policy.latency.models import QueueModel

    model = QueueModel(CostParams())
    same = expected_changes(a, a, model, np.random.default_rng(1))
    assert all(c.change == c.low == c.high == 0 for c in same)
    one = expected_changes(a, b, model, np.random.default_rng(1))
    two = expected_changes(a, b, model, np.random.default_rng(1))
    assert one == two
    recompute = next(c for c in one if c.metric == "recompute_tokens")
    assert recompute.change < 0  # Belady recomputes less than LRU


def test_recommend_reads_a_store(tmp_path, capsys):
    from kvtier.collector.batch import EventBatch
    from kvtier.collector.events import Origin
    from kvtier.collector.store import TraceStore

    path = tmp_path / "store.duckdb"
    origin = Origin(engine="reference", instance="node-1", source="node-1/test")
    with TraceStore(path) as store:
        store.ingest(EventBatch.from_rows(origin, 1, requests=conversations(300, seed=11)))
    out = tmp_path / "reco"
    assert run_verb(["--store", str(path), "--gpu-tokens", str(30 * 16), "--cpu-tokens",
                     str(100 * 16), "--engine", "trtllm", "--out", str(out)]) == 0
    assert (out / "trtllm.yaml").exists() and not (out / "vllm.json").exists()
    assert "verdict:" in capsys.readouterr().out


def test_vllm_eviction_policy_and_store_threshold_are_chosen_by_replay():
    from kvtier.policy.recommend.vllm_sweep import best_cpu_setting, recomputed_tokens
    from kvtier.policy.sim.config import SimConfig

    # one-shot prompts (3 blocks) flush a 4-block CPU tier that should keep two hot 2-block
    # prefixes: storing only on the 2nd offer keeps the one-shots out and halves recompute
    records = []
    for i in range(300):
        hot = [1, 2] if i % 2 else [3, 4]
        records.append(record(i, hot if i % 3 else [10_000 + 3 * i, 10_001 + 3 * i,
                                                     10_002 + 3 * i]))
    chosen, recomputed = best_cpu_setting(records, 1, 4, 150)
    assert recomputed[chosen] == min(recomputed.values())
    assert chosen[1] == 2 and recomputed[chosen] < recomputed["lru", 0, 0]
    # each entry is the replay it names
    config = SimConfig(gpu_blocks=1, cpu_blocks=4, semantics="vllm", policy="arc",
                       store_threshold=3, default_block_tokens=16)
    assert recomputed["arc", 3, 0] == recomputed_tokens(records, config, 150)
    # ties go to vLLM's defaults, lru and 0
    assert best_cpu_setting(records, 1, 2, 150)[0] == ("lru", 0, 0)
    # the same one-shots flush a 6-block GPU pool that keeps both hot prefixes (and the
    # copies vLLM writes of a prompt's recomputed last block) when nothing else is cached:
    # kvtier's GPU filter keeps the one-shots out, with no CPU tier at all
    chosen, recomputed = best_cpu_setting(records, 6, 0, 150, thresholds=(0,),
                                          gpu_sightings=(0, 2))
    assert chosen == ("lru", 0, 2) and recomputed[chosen] < recomputed["lru", 0, 0]


def test_trtllm_gets_token_range_retention_per_request_class(reco_dir):
    out = reco_dir / "a"
    trt = load_recommendation(out / "recommendation.trtllm.json", "trtllm").settings
    gateway = json.loads((out / "trtllm.retention.json").read_text())
    assert gateway == {c.name: c.to_dict() for c in trt.retention_ranges} != {}
    ranges = gateway["default"]["token_range_retention_configs"]
    assert ranges[0]["token_start"] == 0 and ranges[-1]["token_end"] is None
    # TensorRT-LLM's threshold is swept over what the ranges assign, not the per-block classes
    evidence = json.loads((out / "recommendation.json").read_text())["evidence"]
    points = evidence["token_range_sweep"]
    assert {p["min_priority"] for p in points} == {r["priority"] for r in ranges}
    best = min(points, key=lambda p: (p["recompute_tokens"], -p["min_priority"]))
    assert trt.offload_min_priority == best["min_priority"]
    threshold = yaml_get((out / "trtllm.yaml").read_text(),
                         ("kv_cache_config", "secondary_offload_min_priority"))
    for r in ranges:  # the YAML offloads exactly the ranges the sweep chose, under > and >=
        assert (r["priority"] >= best["min_priority"]) == (r["priority"] > threshold)
    report = (out / "report.md").read_text()
    assert "## TensorRT-LLM retention per request class" in report
    assert f"| default | 0-{ranges[0]['token_end'] or 'end'} | {ranges[0]['priority']} |" in report
