"""The same store gives the same verdict and the same latency model whichever documented loop
a user follows: ``recommend --store`` (fitting the store's costs itself), or ``calibrate
--out`` then ``recommend --store --cost-params``."""

from __future__ import annotations

import json

import pytest

from kvtier.cli import main
from tests.policy.engine_model.refengine_store import write_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("loops") / "kvtier.duckdb"
    write_store(path, concurrency=2, requests=120, seed=3)
    return path


def recommend(store, out, *extra) -> dict:
    assert main(["recommend", "--store", str(store), "--gpu-tokens", str(160 * 16),
                 "--host-headroom-bytes", str(1 << 34), "--engine", "vllm", "--out", str(out),
                 *extra]) == 0
    return json.loads((out / "recommendation.json").read_text())["evidence"]


def test_recommend_on_a_store_and_calibrate_then_recommend_agree(store, tmp_path, capsys):
    itself = recommend(store, tmp_path / "itself")
    assert (tmp_path / "itself" / "cost-params.json").exists()  # the costs it fitted, beside it
    params = tmp_path / "cost.json"
    assert main(["calibrate", str(store), "--out", str(params)]) == 0
    given = recommend(store, tmp_path / "given", "--cost-params", str(params))
    capsys.readouterr()
    assert given["verdict"] == itself["verdict"]
    assert given["latency_model"].get("model") == itself["latency_model"].get("model")
    # the prefill rate is this engine's in both, never the default, and every step cost says
    # how many steps it rests on
    for evidence, source in ((itself, "measured"), (given, "calibrated")):
        inputs = {i["name"]: i for i in evidence["inputs"]}
        assert inputs["prefill_tokens_per_s"]["source"] in ("measured", "calibrated")
        step = inputs["step.prefill_token_s"]
        assert step["source"] == source and step["observations"] > 100
        assert "step records" in step["note"]
    report = (tmp_path / "itself" / "report.md").read_text()
    assert f"| `step.prefill_token_s` | {inputs['step.prefill_token_s']['value']:,.6g} |" in \
        (tmp_path / "given" / "report.md").read_text() and "| observations |" in report
