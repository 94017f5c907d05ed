"""The learned vLLM cache policy's file: written by `kvtier recommend --next-use-policy` when
the order, replayed under vLLM's semantics, is not below vLLM's LRU on later time, and read
by the plug-in with the standard library."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvtier.cli import main
from kvtier.policy.learn.deploy import deployment
from kvtier.policy.learn.nextuse import NextUseModel
from kvtier.policy.learn.nextuse import Readout
from kvtier.policy.learn.vllm_deploy import FILE_NAME, VllmNextUse, next_use_for_vllm, write
from kvtier.policy.learn.replay import Tiers
from kvtier.probes.vllm.next_use_twin import NextUseTwin
from kvtier.probes.vllm import next_use_policy
from tests.policy.learn import traffic
from tests.policy.learn.test_evaluate import write_mooncake


@pytest.fixture(scope="module")
def chat():
    return traffic.mixed(hours=0.1, seed=0)


@pytest.fixture(scope="module")
def measured(chat):
    return next_use_for_vllm(chat, Tiers(400, 800), NextUseTwin, 0.5)


def test_an_unsafe_order_is_never_written(measured, tmp_path):
    assert measured.readout is not None and measured.deployable
    lost = dataclasses.replace(measured, learned_hit_ratio=measured.lru_hit_ratio - 0.001)
    assert lost.unsafe and not lost.deployable
    assert write(lost, tmp_path) is None and not (tmp_path / FILE_NAME).exists()
    with pytest.raises(ValueError, match="no deployable"):
        lost.document()
    plain = dataclasses.replace(measured, readout=None, learned_hit_ratio=None)
    assert not plain.unsafe and write(plain, tmp_path) is None


def test_recommend_writes_the_file_the_plug_in_loads(chat, measured, tmp_path, capsys,
                                                     monkeypatch):
    trace = write_mooncake(tmp_path / "chat.jsonl", chat)
    out = tmp_path / "reco"
    assert main(["recommend", "--trace", str(trace), "--gpu-tokens", str(400 * 512),
                 "--cpu-tokens", str(800 * 512), "--engine", "vllm", "--out", str(out),
                 "--host-headroom-bytes", str(64 << 30), "--next-use-policy"]) == 0
    printed = capsys.readouterr().out
    assert "next-use policy: fitting at GPU 400 / CPU 800 blocks" in printed, printed
    path = out / FILE_NAME
    assert f"next-use policy: wrote {FILE_NAME}" in printed, printed
    document = json.loads(path.read_text())
    assert document["readout"]["kind"] == measured.readout.kind  # the same choice
    assert (f"{measured.learned_hit_ratio:.4f} vs vLLM LRU {measured.lru_hit_ratio:.4f} and "
            f"vLLM's store_threshold 2 (its LRU storing a block on its second request) "
            f"{measured.simple_rule_hit_ratio:.4f} on later time") in printed
    assert ("BELOW vLLM's store_threshold 2" in printed) == (measured.behind_simple_rule is not None)
    model = NextUseModel.from_json(document["model"])
    assert document == deployment(model, measured.readout)  # round-trips, nothing lost
    monkeypatch.setenv(next_use_policy.MODEL_ENV, str(path))
    next_use_policy.configure(None)
    try:
        reader = next_use_policy._model()  # what the engine does at start
        assert reader is not None and reader.kind == measured.readout.kind
    finally:
        next_use_policy.configure(None)


def test_the_simple_rule_is_vllms_own_store_threshold_replayed_on_the_same_requests():
    """The figure beside the plug-in's is vLLM's LRU storing a block on its second request,
    as recommend's vLLM sweep replays that setting, on the same later requests (chat, whose
    one-time prompts the rule keeps out)."""
    from kvtier.policy.learn.split import Split
    from kvtier.policy.recommend.vllm_sweep import vllm_replay

    records = traffic.chat(hours=0.1, seed=0)
    result = next_use_for_vllm(records, Tiers(400, 800), NextUseTwin, 0.5)
    split = Split.by_time(records, 0.5)
    swept = vllm_replay(split.records, 400, 800, split.count_from, ("lru", 2, 0)).result
    assert result.simple_rule_hit_ratio == pytest.approx(swept.token_hit_ratio, abs=1e-12)
    assert result.simple_rule_hit_ratio > result.lru_hit_ratio + 0.02


def test_an_order_below_the_simple_rule_is_reported_with_the_gap(measured, chat, tmp_path,
                                                                 capsys, monkeypatch):
    from kvtier.policy.learn import vllm_deploy

    ahead = measured.learned_hit_ratio + 0.0123
    below = dataclasses.replace(measured, simple_rule_hit_ratio=ahead)
    assert below.behind_simple_rule == pytest.approx(0.0123) and below.deployable
    assert dataclasses.replace(measured, simple_rule_hit_ratio=None).behind_simple_rule is None
    monkeypatch.setattr(vllm_deploy, "next_use_for_vllm", lambda *args: below)
    trace = write_mooncake(tmp_path / "chat.jsonl", chat)
    assert main(["recommend", "--trace", str(trace), "--gpu-tokens", str(400 * 512),
                 "--cpu-tokens", str(800 * 512), "--engine", "vllm", "--out",
                 str(tmp_path / "reco"), "--host-headroom-bytes", str(64 << 30),
                 "--next-use-policy"]) == 0
    printed = capsys.readouterr().out
    assert f"next-use policy: wrote {FILE_NAME}" in printed  # still above vLLM's LRU
    assert "next-use policy: BELOW vLLM's store_threshold 2 by 1.23 points on later time" in printed


def test_a_bad_file_is_one_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "broken.json"
    path.write_text('{"model": {"kind": "something else"}, "readout": {}}')
    monkeypatch.setenv(next_use_policy.MODEL_ENV, str(path))
    next_use_policy.configure(None)
    with pytest.raises(ValueError, match="not a kvtier next-use policy file"):
        next_use_policy._model()
    next_use_policy.configure(None)
