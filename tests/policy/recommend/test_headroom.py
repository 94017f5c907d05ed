"""`kvtier recommend` sizes the CPU tier within the host's headroom, and push holds it there."""

from __future__ import annotations

import json

import pytest

from kvtier.cli import main
from kvtier.policy.cost import CostParams
from kvtier.policy.recommend.build import Inputs, recommend
from kvtier.policy.recommend.headroom import HostLimit, from_bytes, from_probe_json
from kvtier.policy.writers.textedit import env_get
from tests.policy.writers.args_file import args_get
from kvtier.policy.writers.yamledit import yaml_get
from tests.policy.learn.synthetic import conversations
from tests.policy.learn.test_evaluate import write_mooncake
from tests.policy.recommend.test_recommend import run_verb

GiB = 1 << 30
BLOCK_TOKENS = 512
BLOCK_BYTES = BLOCK_TOKENS * CostParams().model.bytes_per_token  # 64 MiB
ARGS = ["--gpu-tokens", str(30 * BLOCK_TOKENS), "--cpu-tokens", str(200 * BLOCK_TOKENS),
        "--prefill-servers", "4", "--seed", "3"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return write_mooncake(tmp_path_factory.mktemp("t") / "t.jsonl",
                          conversations(900, seed=8, block_tokens=BLOCK_TOKENS))


@pytest.fixture(scope="module")
def capped(trace, tmp_path_factory):
    """5 GiB of headroom less the 1 GiB minimum margin: 4 GiB, 64 blocks of the 200 asked."""
    out = tmp_path_factory.mktemp("capped")
    assert run_verb(["--trace", str(trace), *ARGS, "--host-headroom-bytes", str(5 * GiB),
                     "--out", str(out)]) == 0
    return out


def test_given_headroom_keeps_a_stated_margin():
    assert from_bytes(5 * GiB).cap_bytes == 4 * GiB        # 10% is under the 1 GiB minimum
    assert from_bytes(100 * GiB).cap_bytes == 90 * GiB     # 10% of it
    assert "safety margin" in from_bytes(GiB).source
    assert from_bytes(GiB // 2).cap_bytes == 0


def test_probe_json_gives_its_safe_bytes_and_refuses_other_files(tmp_path):
    body = {"probe": "headroom", "available_bytes": 10 * GiB, "margin_bytes": GiB,
            "reserve_bytes": 2 * GiB, "safe_bytes": 7 * GiB, "limited_by": "cgroup"}
    path = tmp_path / "h.json"
    path.write_text(json.dumps(body))
    limit = from_probe_json(path)
    assert (limit.cap_bytes, limit.margin_bytes) == (7 * GiB, 3 * GiB)
    path.write_text(json.dumps({**body, "probe": "fs"}))
    with pytest.raises(ValueError, match="probe headroom"):
        from_probe_json(path)
    path.write_text(json.dumps({**body, "safe_bytes": 9 * GiB}))
    with pytest.raises(ValueError, match="safe_bytes"):
        from_probe_json(path)


def test_every_engine_host_size_is_capped_and_the_cap_is_recorded(capped):
    cap = 4 * GiB
    data = json.loads((capped / "recommendation.json").read_text())
    assert data["settings"]["cpu_tier_bytes"] == 64 * BLOCK_BYTES == cap
    assert data["guardrails"] == {"host_headroom_bytes": cap}
    host = data["evidence"]["host_memory"]
    assert host["capped"] and host["requested_cpu_bytes"] == 200 * BLOCK_BYTES
    assert host["safety_margin_bytes"] == GiB
    assert data["evidence"]["tiers_blocks"]["cpu"] == 64
    # the expected figures are the capped size's: its LRU baseline is the one measured
    assert host["token_hit_ratio_lru_at_cap"] == data["evidence"]["token_hit_ratio"]["cpu_lru_admit_all"]
    assert host["token_hit_ratio_lru_at_requested"] != host["token_hit_ratio_lru_at_cap"]
    vllm = json.loads((capped / "vllm.json").read_text())["kv_connector_extra_config"]
    assert vllm["cpu_bytes_to_use"] <= cap
    trt = (capped / "trtllm.yaml").read_text()
    assert 0 < yaml_get(trt, ("kv_cache_config", "host_cache_size")) <= cap
    assert 0 < yaml_get((capped / "lmcache.yaml").read_text(), ("max_local_cpu_size",)) * GiB <= cap
    assert 0 < float(env_get((capped / "dynamo.env").read_text(), "DYN_KVBM_CPU_CACHE_GB")) * GiB <= cap
    assert 0 < int(args_get((capped / "sglang.args").read_text(), "--hicache-size")) * GiB <= cap
    report = (capped / "report.md").read_text()
    assert "was capped to 4.00 GiB" in report


def test_push_reads_the_headroom_recorded_in_the_recommendation(capped, tmp_path, capsys):
    reco = json.loads((capped / "recommendation.vllm.json").read_text())
    config = tmp_path / "vllm.json"
    assert main(["push", "--recommendation", str(capped / "recommendation.vllm.json"),
                 "--engine", "vllm", "--config", str(config)]) == 0
    reco["settings"]["cpu_tier_bytes"] = 5 * GiB  # an operator's edit past the cap
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(reco))
    assert main(["push", "--recommendation", str(edited), "--engine", "vllm",
                 "--config", str(config)]) == 2
    assert f"exceeds the host headroom the recommendation was made with: 4.0 GiB" in capsys.readouterr().err


def test_without_a_number_recommend_measures_this_host(trace, tmp_path, host_headroom):
    host_headroom(5 * GiB)  # what the headroom probe reads on this host
    assert run_verb(["--trace", str(trace), *ARGS, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "recommendation.json").read_text())
    assert data["guardrails"] == {"host_headroom_bytes": 5 * GiB}
    assert data["evidence"]["host_memory"]["checked"] is True
    assert data["evidence"]["host_memory"]["source"] == "the test's host"
    assert data["settings"]["cpu_tier_bytes"] <= 5 * GiB


def test_where_host_memory_cannot_be_read_the_report_says_it_was_not_checked(trace, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr("kvtier.host.measured_host_limit", lambda root="/": None)
    assert run_verb(["--trace", str(trace), *ARGS, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "recommendation.json").read_text())
    assert data["guardrails"] == {} and data["evidence"]["host_memory"]["checked"] is False
    assert data["settings"]["cpu_tier_bytes"] == 200 * BLOCK_BYTES
    assert "was **not checked against host memory**" in (tmp_path / "report.md").read_text()


def test_a_headroom_below_one_block_means_do_not_offload():
    records = conversations(400, seed=8, block_tokens=BLOCK_TOKENS)
    rec = recommend(records, Inputs(30, 200, host=HostLimit(BLOCK_BYTES - 1, 0, "test")))
    assert rec.verdict.outcome == "do_not_offload" and rec.settings.cpu_tier_bytes == 0
    assert any("host DRAM is contested" in r.name for r in rec.verdict.reasons if r.holds)
