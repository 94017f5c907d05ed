"""The recommendation's typed values: JSON round trip, readers of the file, bad input named."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvtier.collector.exports.recommendation import RecommendationLabels
from kvtier.policy.recommend import report
from kvtier.policy.recommend.build import Inputs, recommend
from kvtier.policy.recommend.recommendation import from_json
from kvtier.policy.recommend.values import Evidence, HitRatios, HostCheck, Reason, Verdict, decode, encode
from kvtier.policy.writers import ENGINES
from kvtier.policy.writers.push import load_recommendation
from tests.policy.learn.synthetic import conversations, record


@pytest.fixture(scope="module")
def offload():
    return recommend(conversations(500, seed=8, block_tokens=512), Inputs(30, 200, prefill_servers=4))


def test_a_recommendation_survives_its_json_unchanged(offload):
    again = from_json(json.loads(json.dumps(offload.to_json())))
    assert again == offload  # every typed field, evidence included
    assert again.evidence.sweep and again.evidence.model.held_out.rows > 0


def test_a_do_not_offload_recommendation_survives_its_json_too():
    unique = [record(i, [1000 * i + j for j in range(4)]) for i in range(200)]
    rec = recommend(unique, Inputs(gpu_blocks=50, cpu_blocks=200))
    assert rec.verdict.outcome == "do_not_offload" and rec.evidence.model is None
    assert from_json(json.loads(json.dumps(rec.to_json()))) == rec


def test_the_written_file_is_what_push_and_the_collector_read(offload, tmp_path):
    report.write(offload, tmp_path, ENGINES)
    loaded = load_recommendation(tmp_path / "recommendation.json")
    settings = loaded.settings
    assert settings == offload.settings and loaded.guardrails == offload.guardrails
    labels = RecommendationLabels(tmp_path / "recommendation.json")()
    assert labels["verdict"] == "offload" and labels["cpu_tier_bytes"] == str(settings.cpu_tier_bytes)
    assert from_json(json.loads((tmp_path / "recommendation.json").read_text())) == offload


def test_bad_input_is_named_by_its_path():
    good = encode(Evidence(Verdict("offload", (Reason("prompts are unique", False, "37%"),)),
                           HostCheck(False, why="not given"), HitRatios(0.4)))
    bad = json.loads(json.dumps(good))
    bad["reuse_verdict"]["reasons"][0]["holds"] = "no"
    with pytest.raises(ValueError, match=r"evidence\.reuse_verdict\.reasons\[0\]\.holds"):
        decode(Evidence, bad, "evidence")
    bad = json.loads(json.dumps(good))
    bad["token_hit_ratio"]["gpu_onyl"] = 0.3
    with pytest.raises(ValueError, match="unknown key.*gpu_onyl"):
        decode(Evidence, bad, "evidence")
    bad = json.loads(json.dumps(good))
    del bad["host_memory"]
    with pytest.raises(ValueError, match="missing 'host_memory'"):
        decode(Evidence, bad, "evidence")
    with pytest.raises(ValueError, match="verdict must be one of offload, do_not_offload"):
        Verdict("maybe")


def test_an_unknown_reason_state_survives_json():
    reason = Reason("host DRAM is contested", None, "give --headroom-json")
    assert encode(reason) == {"reason": "host DRAM is contested", "holds": None,
                              "evidence": "give --headroom-json"}
    assert decode(Reason, encode(reason)) == reason


def test_other_versions_are_refused_with_a_way_out(offload):
    doc = offload.to_json()
    doc["version"] = 1
    with pytest.raises(ValueError, match="re-run kvtier recommend"):
        from_json(doc)


def test_the_values_import_nothing_but_the_standard_library():
    code = ("import sys; import kvtier.policy.recommend.recommendation; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'pandas', 'duckdb', 'pyarrow', 'sklearn', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
