"""`kvtier push`: diff, dry run, guardrails, backup, atomic replace."""

from __future__ import annotations

import json
import os
import stat

import pytest

from kvtier.cli import main
from policy.writers.push import PushRefused, apply, load_recommendation, plan
from policy.writers.settings import EngineSettings, Guardrails

GiB = 1 << 30
TRT = "# tuned by hand\nkv_cache_config:\n  free_gpu_memory_fraction: 0.85\n  host_cache_size: 1000\n"


@pytest.fixture
def files(tmp_path):
    reco = tmp_path / "recommendation.json"
    reco.write_text(json.dumps({"settings": {"cpu_tier_bytes": 16 * GiB, "kv_events": True},
                                "guardrails": {"host_headroom_bytes": 64 * GiB}}))
    config = tmp_path / "trtllm.yaml"
    config.write_text(TRT)
    config.chmod(0o640)
    return reco, config


def push(reco, config, *extra):
    return main(["push", "--recommendation", str(reco), "--engine", "trtllm",
                 "--config", str(config), *extra])


def test_dry_run_prints_the_diff_and_writes_nothing(files, capsys):
    reco, config = files
    assert push(reco, config, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "-  host_cache_size: 1000\n+  host_cache_size: 17179869184\n" in out
    assert "dry run: nothing written" in out
    assert config.read_text() == TRT and len(list(config.parent.iterdir())) == 2


def test_push_writes_atomically_keeps_a_backup_and_the_mode(files, capsys):
    reco, config = files
    assert push(reco, config) == 0
    out = capsys.readouterr().out
    (backup,) = [p for p in config.parent.iterdir() if p.name.endswith(".bak")]
    assert backup.read_text() == TRT and f"backup: {backup}" in out
    assert "host_cache_size: 17179869184" in config.read_text()
    assert "# tuned by hand" in config.read_text()
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert not [p for p in config.parent.iterdir() if p.name.endswith(".tmp")]
    assert push(reco, config) == 0  # a second push changes nothing and backs up nothing
    assert "already up to date" in capsys.readouterr().out
    assert len([p for p in config.parent.iterdir() if p.name.endswith(".bak")]) == 1


def test_new_file_is_created_without_backup(tmp_path, files):
    reco, _ = files
    config = tmp_path / "sub" / "new.yaml"
    assert push(reco, config) == 0
    assert "host_cache_size: 17179869184" in config.read_text()


@pytest.mark.parametrize("reco_data, message", [
    ({"settings": {"cpu_tier_bytes": 16 * GiB}, "guardrails": {"host_headroom_bytes": GiB}},
     "exceeds the measured host headroom"),
    ({"settings": {"offload_min_priority": 150}}, "0..100"),
    ({"settings": {"host_bytes": 1}}, "unknown setting"),
    ({"settings": {}, "surprise": 1}, "unknown recommendation key"),
    ({"settings": {}, "guardrails": {"gpu": 1}}, "bad guardrails"),
    ({"settings": {"eviction_policy": "arc"}}, "priority then LRU"),
])
def test_guardrails_refuse_and_leave_the_file_alone(tmp_path, files, capsys, reco_data, message):
    _, config = files
    reco = tmp_path / "bad.json"
    reco.write_text(json.dumps(reco_data))
    assert push(reco, config) == 2
    assert message in capsys.readouterr().err
    assert config.read_text() == TRT


def test_headroom_flag_overrides_the_recommendation(files, capsys):
    reco, config = files
    assert push(reco, config, "--host-headroom-bytes", str(GiB)) == 2
    assert "exceeds the measured host headroom of 1073741824" in capsys.readouterr().err


def test_unreadable_recommendation(tmp_path, files):
    _, config = files
    with pytest.raises(PushRefused, match="cannot read"):
        load_recommendation(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(PushRefused, match="not JSON"):
        load_recommendation(tmp_path / "x.json")


def test_a_failed_write_leaves_the_old_file(files, monkeypatch):
    _, config = files
    p = plan(EngineSettings(cpu_tier_bytes=GiB), Guardrails(), "trtllm", config)

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        apply(p)
    assert config.read_text() == TRT
    assert not [q for q in config.parent.iterdir() if q.name.endswith(".tmp")]
