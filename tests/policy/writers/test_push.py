"""`kvtier push`: diff, dry run, guardrails, backup, atomic replace."""

from __future__ import annotations

import json
import os
import stat

import pytest

from kvtier.cli import main
from kvtier.policy.recommend.recommendation import KIND, VERSION
from kvtier.policy.writers.push import PushRefused, apply, load_recommendation, plan
from kvtier.policy.writers.settings import EngineSettings, Guardrails

GiB = 1 << 30
TRT = "# tuned by hand\nkv_cache_config:\n  free_gpu_memory_fraction: 0.85\n  host_cache_size: 1000\n"


@pytest.fixture(autouse=True)
def roomy_host(host_headroom):
    host_headroom(1 << 40)  # this host's memory is not what these tests are about


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
     "exceeds the host headroom the recommendation was made with: 1.0 GiB"),
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
    assert "exceeds --host-headroom-bytes: 1.0 GiB" in capsys.readouterr().err


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
    assert not [q for q in config.parent.iterdir() if q.name.endswith((".tmp", ".bak"))]


def neutral(tmp_path):
    """A neutral recommendation.json as kvtier recommend writes it: every engine's settings in
    its evidence, the neutral ones (no eviction_policy, no store_threshold) on top."""
    reco = tmp_path / "recommendation.json"
    reco.write_text(json.dumps({
        "kind": KIND, "version": VERSION,
        "settings": {"cpu_tier_bytes": 4 * GiB, "offload_min_priority": 20},
        "evidence": {"engines": {"vllm": {"cpu_tier_bytes": 4 * GiB, "eviction_policy": "arc",
                                          "store_threshold": 2},
                                 "trtllm": {"cpu_tier_bytes": 4 * GiB, "offload_min_priority": 20}}}}))
    return reco


def test_the_neutral_file_gives_each_engine_its_own_settings(tmp_path, capsys):
    config = tmp_path / "vllm.json"
    assert main(["push", "--recommendation", str(neutral(tmp_path)), "--engine", "vllm",
                 "--config", str(config)]) == 0
    extra = json.loads(config.read_text())["kv_connector_extra_config"]
    assert extra == {"cpu_bytes_to_use": 4 * GiB, "eviction_policy": "arc", "store_threshold": 2}
    assert f"reading the vllm settings in {tmp_path / 'recommendation.json'}" in capsys.readouterr().out
    assert main(["push", "--recommendation", str(neutral(tmp_path)), "--engine", "lmcache",
                 "--config", str(tmp_path / "lmcache.yaml")]) == 2
    assert "has no lmcache settings (it has vllm, trtllm)" in capsys.readouterr().err


def test_another_engines_file_is_refused(tmp_path, capsys):
    reco = tmp_path / "recommendation.trtllm.json"
    reco.write_text(json.dumps({"engine": "trtllm", "settings": {"cpu_tier_bytes": GiB}}))
    config = tmp_path / "vllm.json"
    config.write_text("{}\n")
    assert main(["push", "--recommendation", str(reco), "--engine", "vllm", "--config", str(config)]) == 2
    assert "holds the trtllm settings, not vllm's" in capsys.readouterr().err
    assert config.read_text() == "{}\n"


VLLM_YAML = """\
# chat fleet
model: m   # the model
kv_transfer_config: '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}'
"""


def test_a_yaml_key_is_edited_in_its_own_spelling_with_comments_kept(tmp_path):
    reco = tmp_path / "r.json"
    reco.write_text(json.dumps({"settings": {"cpu_tier_bytes": GiB}}))
    config = tmp_path / "serve.yaml"
    config.write_text(VLLM_YAML)
    assert main(["push", "--recommendation", str(reco), "--engine", "vllm", "--config", str(config)]) == 0
    text = config.read_text()
    assert text.startswith("# chat fleet\nmodel: m   # the model\nkv_transfer_config: ")
    assert "kv-transfer-config" not in text and '"cpu_bytes_to_use": 1073741824' in text


@pytest.mark.parametrize("text, says", [
    (VLLM_YAML + "kv-transfer-config: '{}'\n", "are two spellings of one key"),
    ("model: m\nmodel: n\n", "a key is written twice"),
    ("model: [m\n", "not valid YAML"),
    ("- m\n", "the top of the file is a list"),
])
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_yaml_file_it_cannot_edit_safely_is_refused_untouched(tmp_path, capsys, text, says, dry_run):
    reco = tmp_path / "r.json"
    reco.write_text(json.dumps({"settings": {"cpu_tier_bytes": GiB}}))
    config = tmp_path / "serve.yaml"
    config.write_text(text)
    assert main(["push", "--recommendation", str(reco), "--engine", "vllm", "--config",
                 str(config), *dry_run]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"kvtier push: error: push refused: {config}: ") and says in line
    assert config.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "serve.yaml"]


def test_a_cpu_tier_above_this_hosts_memory_is_refused_unless_forced(files, capsys, host_headroom):
    reco, config = files  # 16 GiB asked; the recommendation was made on a 64 GiB host
    host_headroom(4 * GiB)
    assert push(reco, config) == 2
    err = capsys.readouterr().err
    assert "the CPU tier (16.0 GiB, cpu_tier_bytes=17179869184) exceeds this host's memory headroom" in err
    assert "add --force" in err and config.read_text() == TRT
    assert push(reco, config, "--host-headroom-bytes", str(32 * GiB)) == 0  # the engine's host
    config.write_text(TRT)
    assert push(reco, config, "--force") == 0
    assert "pushed anyway (--force)" in capsys.readouterr().err
    assert "host_cache_size: 17179869184" in config.read_text()
