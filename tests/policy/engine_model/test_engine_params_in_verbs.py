"""`kvtier simulate|recommend --cost-params FILE` with an ``engine_model`` section: TTFT comes
from the step-level engine model; without the section, from the FIFO queue (simulate), and
recommend promises no TTFT on a default prefill rate."""

from __future__ import annotations

import json

import pytest

from kvtier.cli import main
from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.engine_model.step_cost import StepCost
from tests.policy.learn.synthetic import conversations
from tests.policy.learn.test_evaluate import write_mooncake
from tests.policy.recommend.test_engine_inputs import _recommend_trace

pytestmark = pytest.mark.timeout(300)


def test_expected_ttft_comes_from_the_engine_model_when_its_parameters_are_given(tmp_path):
    trace = write_mooncake(tmp_path / "t.jsonl", conversations(300, seed=8, block_tokens=512))
    body = {"probe": "calibrate", "kv_bytes_per_token": 131072, "cost_params": {}}
    plain, stepped = tmp_path / "plain.json", tmp_path / "stepped.json"
    plain.write_text(json.dumps(body))
    # every step costs at least 1 s: no request's first token comes sooner
    engine = EngineModelParams(StepCost(overhead_s=1.0, prefill_token_s=1e-5),
                               SchedulerLimits(max_running=64), kv_bytes_per_token=131072)
    stepped.write_text(json.dumps(body | {"engine_model": engine.to_dict()}))
    docs = {}
    for name, path in (("plain", plain), ("stepped", stepped)):
        assert _recommend_trace(trace, tmp_path / name, "--cost-params", str(path)) == 0
        doc = json.loads((tmp_path / name / "recommendation.json").read_text())
        docs[name] = {c["metric"]: c for c in doc["evidence"]["expected_vs_gpu_only"]}
    assert docs["stepped"]["ttft_p50_s"]["baseline"] >= 1.0
    assert docs["stepped"]["ttft_p50_s"]["candidate"] >= 1.0
    assert "ttft_p50_s" not in docs["plain"]  # no engine model, a default prefill rate: no promise
    # the GPU tier alone is the tier replay's either way
    assert docs["stepped"]["gpu_hit_tokens"]["baseline"] == docs["plain"]["gpu_hit_tokens"]["baseline"]


def test_simulate_estimates_ttft_with_the_engine_model_when_its_parameters_are_given(tmp_path, capsys):
    trace = write_mooncake(tmp_path / "t.jsonl", conversations(200, seed=9, block_tokens=512))
    body = {"probe": "calibrate", "kv_bytes_per_token": 131072, "cost_params": {}}
    engine = EngineModelParams(StepCost(overhead_s=1.0), SchedulerLimits(max_running=256),
                               kv_bytes_per_token=131072)
    plain, stepped = tmp_path / "plain.json", tmp_path / "stepped.json"
    plain.write_text(json.dumps(body))
    stepped.write_text(json.dumps(body | {"engine_model": engine.to_dict()}))
    out = {}
    for name, path in (("plain", plain), ("stepped", stepped)):
        assert main(["simulate", "--trace", str(trace), "--policy", "vllm", "--gpu-tokens", "1e6",
                     "--cost-params", str(path), "--json"]) == 0
        out[name] = json.loads(capsys.readouterr().out)
    assert out["stepped"]["ttft_p50_s"] >= 1.0 > out["plain"]["ttft_p50_s"]
    assert out["stepped"]["parameter_sources"]["engine_model"] == "calibrated"
    assert out["stepped"]["token_hit_ratio"] == out["plain"]["token_hit_ratio"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(body | {"engine_model": {"version": 99}}))
    assert main(["simulate", "--trace", str(trace), "--gpu-tokens", "1e6", "--cost-params", str(bad)]) == 2
    assert "version 99" in capsys.readouterr().err
