"""`kvtier recommend --cost-params FILE` with an ``engine_model`` section: the expected TTFT
levels come from the step-level engine model; without the section, from the FIFO queue."""

from __future__ import annotations

import json

import pytest

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
    assert docs["plain"]["ttft_p50_s"]["baseline"] < 1.0
    # the token split is the tier replay's either way
    assert docs["stepped"]["gpu_hit_tokens"] == docs["plain"]["gpu_hit_tokens"]
