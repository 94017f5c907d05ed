"""Whether to add a file tier: measured cold-promotion cost against recompute, then the
simulated gain; one rule for `kvtier recommend` (vLLM) and the rollout."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, Tier
from kvtier.collector.store import TraceStore
from kvtier.policy.cost import CostParams
from kvtier.policy.recommend.cold_tier import ColdCost, cost_from_params, decide
from kvtier.rollout.plan import RolloutPlan
from kvtier.policy.cost import measured_cost_params
from tests.policy.learn.synthetic import conversations
from tests.policy.learn.test_evaluate import write_mooncake
from tests.policy.recommend.test_recommend import run_verb
from tests.kvtier.rollout.test_rollout import RecordingSwitcher, looping_trace

BLOCK_TOKENS = 512
# 30 GPU and 40 CPU blocks of 512 tokens; the file tier holds 400 more
ARGS = ["--gpu-tokens", str(30 * BLOCK_TOKENS), "--cpu-tokens", str(40 * BLOCK_TOKENS),
        "--cold-tokens", str(400 * BLOCK_TOKENS), "--prefill-servers", "4", "--seed", "3",
        "--host-headroom-bytes", str(1 << 40)]  # not this machine's memory: the same everywhere
CHEAP = ColdCost(512, 0.030, 0.064, "test")
DEAR = ColdCost(512, 0.064, 0.064, "test")


def fs_probe(tmp_path, bandwidth_bytes_per_s: float):
    path = tmp_path / f"fs-{bandwidth_bytes_per_s:g}.json"
    path.write_text(json.dumps({"probe": "fs", "cost_params": {
        "cold_cpu_bandwidth_bytes_per_s": bandwidth_bytes_per_s, "cold_cpu_op_latency_s": 2e-4}}))
    return path


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return write_mooncake(tmp_path_factory.mktemp("t") / "t.jsonl",
                          conversations(900, seed=8, block_tokens=BLOCK_TOKENS))


def test_a_cold_promotion_as_dear_as_recompute_is_never_worth_a_file_tier():
    no = decide(0.5, 0.02, DEAR)
    assert not no.add and no.reason.startswith("do not add a file tier")
    assert "64 ms" in no.reason and "50.0%" in no.reason
    assert decide(0.5, 0.02, CHEAP).add
    low = decide(0.01, 0.02, CHEAP)
    assert not low.add and "retention value too low" in low.reason


def test_the_probe_measurement_decides_the_cost(tmp_path):
    default = cost_from_params(CostParams(), BLOCK_TOKENS)
    assert not default.measured and default.promotion_s < default.recompute_s
    # 64 MiB per 512-token block at 0.5 GB/s: ~134 ms, over the 64 ms prefill
    slow = cost_from_params(measured_cost_params(fs_probe(tmp_path, 5e8)), BLOCK_TOKENS)
    assert slow.measured and slow.promotion_s > slow.recompute_s


def vllm_file(out):
    data = json.loads((out / "recommendation.json").read_text())
    knob = next(k for k in data["evidence"]["knobs"] if k["name"] == "vllm_file_tier_bytes")
    extra = json.loads((out / "vllm.json").read_text())["kv_connector_extra_config"]
    return knob, data["evidence"]["vllm_file_tier"], extra


def test_recommend_adds_the_file_tier_when_promotion_is_cheaper_and_the_gain_pays(trace, tmp_path):
    out = tmp_path / "fast"
    assert run_verb(["--trace", str(trace), *ARGS, "--fs-json", str(fs_probe(tmp_path, 4e9)),
                     "--cold-path", "/mnt/nvme/kv", "--out", str(out)]) == 0
    knob, evidence, extra = vllm_file(out)
    assert evidence["add"] and evidence["gain"] >= evidence["min_gain"]
    assert evidence["cost"]["measured"]
    assert knob["value"] == 400 * BLOCK_TOKENS * CostParams().model.bytes_per_token
    assert extra["spec_name"] == "TieringOffloadingSpec" and extra["store_threshold"] == 0
    assert extra["secondary_tiers"][0]["root_dir"] == "/mnt/nvme/kv"


def test_recommend_refuses_the_file_tier_when_a_measured_promotion_costs_more(trace, tmp_path):
    out = tmp_path / "slow"
    assert run_verb(["--trace", str(trace), *ARGS, "--fs-json", str(fs_probe(tmp_path, 5e8)),
                     "--cold-path", "/mnt/nvme/kv", "--out", str(out)]) == 0
    knob, evidence, extra = vllm_file(out)
    assert not evidence["add"] and knob["value"] == 0
    assert knob["why"].startswith("do not add a file tier: a cold promotion of a 512-token block")
    assert evidence["cost"]["promotion_s"] >= evidence["cost"]["recompute_s"]
    assert "secondary_tiers" not in extra
    assert "do not add a file tier" in (out / "report.md").read_text()


def test_recommend_from_a_store_uses_its_measured_cold_promotions(tmp_path):
    records = conversations(300, seed=8, block_tokens=BLOCK_TOKENS)
    # the engine measured 0.3 ms per token from the file tier and 0.1 ms per token to recompute
    events = [BlockEvent(float(i), Outcome.COLD_PROMOTION, 10_000 + i, tokens=BLOCK_TOKENS,
                         tier_from=Tier.COLD, tier_to=Tier.GPU, latency_s=0.3e-3 * BLOCK_TOKENS)
              for i in range(5)]
    events += [BlockEvent(float(i), Outcome.RECOMPUTE_MISS, 20_000 + i, tokens=BLOCK_TOKENS,
                          latency_s=0.1e-3 * BLOCK_TOKENS) for i in range(5)]
    with TraceStore(tmp_path / "s.duckdb") as store:
        store.ingest(EventBatch.from_rows(Origin("reference", "n1", "n1/t"), 0, events, records))
    out = tmp_path / "out"
    assert run_verb(["--store", str(tmp_path / "s.duckdb"), *ARGS, "--out", str(out)]) == 0
    _, evidence, _ = vllm_file(out)
    assert evidence["reason"].startswith("do not add a file tier")
    assert "s.duckdb" in evidence["cost"]["source"]
    assert evidence["cost"]["promotion_s"] == pytest.approx(0.3e-3 * BLOCK_TOKENS)
    assert evidence["cost"]["recompute_s"] == pytest.approx(0.1e-3 * BLOCK_TOKENS)


@pytest.mark.parametrize("cost, runs", [(CHEAP, True), (DEAR, False)])
def test_rollout_uses_the_same_rule(cost, runs):
    # 20 prompts x 8 blocks come back every 160 blocks: only the file tier holds them
    records = looping_trace(20, 8, 4)

    def run_phase(tiers):
        return [replace(r, tier_config_id=tiers.config_id) for r in records], 0

    from kvtier.rollout.runner import run_rollout

    plan = RolloutPlan(gpu_blocks=8, cpu_blocks=64, cold_blocks=512, min_cold_gain=0.05,
                       cold_cost=ColdCost(16, cost.promotion_s, cost.recompute_s, "test"))
    switcher = RecordingSwitcher()
    report = run_rollout(plan, switcher, run_phase, block_tokens=16)
    assert ("gpu+cpu+file" in switcher.applied) == runs
    if not runs:
        assert report.skipped[0][1].startswith("do not add a file tier")
