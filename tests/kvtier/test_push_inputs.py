"""What `kvtier push` reads is bounded: regular files only, sizes, YAML aliases and nesting,
and an edit whose work grows with the file, not faster. Each hostile input ends in one line,
exit 2, with nothing written; run through the real command line, as an operator would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.policy.recommend.recommendation import KIND, VERSION
from kvtier.policy.writers.inputs import CONFIG_LIMIT_BYTES, DEPTH_LIMIT, RECOMMENDATION_LIMIT_BYTES

GiB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]
SERVE = "model: m\nkv-transfer-config: '{\"kv_connector\": \"OffloadingConnector\", " \
        "\"kv_role\": \"kv_both\", \"kv_connector_extra_config\": {\"cpu_bytes_to_use\": 1}}'\n"
# a hang guard only: each case below ends in well under a second when bounded
HANG_GUARD_S = 120


def reco(folder: Path) -> Path:
    path = folder / "reco.json"
    path.write_text(json.dumps({"kind": KIND, "version": VERSION,
                                "settings": {"cpu_tier_bytes": 4 * GiB}}))
    return path


def push(recommendation: Path, config: Path, engine: str = "vllm") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "kvtier", "push", "--recommendation", str(recommendation),
         "--engine", engine, "--config", str(config), "--host-headroom-bytes", str(1 << 40)],
        capture_output=True, text=True, timeout=HANG_GUARD_S, env=env)


def refused(done: subprocess.CompletedProcess, says: str, folder: Path, before: dict) -> None:
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("kvtier push: error: push refused") and says in line, line
    assert "Traceback" not in done.stderr and "unexpected" not in line
    assert snapshot(folder) == before  # nothing written, no backup


def snapshot(folder: Path) -> dict:
    return {p.name: (p.read_bytes() if p.is_file() and not p.is_fifo() else None)
            for p in folder.iterdir()}


def test_a_recommendation_that_is_a_fifo_is_refused_without_opening_it_for_good(tmp_path):
    fifo = tmp_path / "reco.json"
    os.mkfifo(fifo)  # a push that waited on it would wait for a writer forever
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE)
    before = snapshot(tmp_path)
    refused(push(fifo, config), f"recommendation {fifo} is a FIFO (named pipe)", tmp_path, before)


@pytest.mark.parametrize("which", ["recommendation", "config"])
def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, which):
    recommendation, config = reco(tmp_path), tmp_path / "serve.yaml"
    config.write_text(SERVE)
    big, limit, pad = ((recommendation, RECOMMENDATION_LIMIT_BYTES, b" ") if which == "recommendation"
                       else (config, CONFIG_LIMIT_BYTES, b"#"))
    with open(big, "r+b") as handle:  # still valid: trailing spaces or a comment past the limit
        handle.seek(0, os.SEEK_END)
        handle.write(pad * (limit + 1 - handle.tell()) + b"\n")
    before = snapshot(tmp_path)
    refused(push(recommendation, config), f"over the {limit >> 20}.0 MiB kvtier push reads",
            tmp_path, before)


def alias_bomb() -> str:
    """Nine levels of nine aliases: 387 million values from 500 bytes."""
    lines = ["model: m", "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("engine, name, text, says", [
    ("vllm", "bomb.yaml", alias_bomb(), "aliases (*name) expand to more than"),
    ("trtllm", "bomb.yaml", alias_bomb(), "aliases (*name) expand to more than"),
    ("vllm", "deep.yaml", "model: m\nx: " + "[" * 20_000 + "]" * 20_000 + "\n",
     f"nested more than {DEPTH_LIMIT} levels deep"),
    ("vllm", "deep-string.yaml", "model: m\nkv-transfer-config: '{\"a\": " + "[" * 20_000
     + "]" * 20_000 + "}'\n", f"nested more than {DEPTH_LIMIT} levels deep"),
    ("vllm", "deep.json", '{"a": ' + "[" * 20_000 + "]" * 20_000 + "}",
     f"nested more than {DEPTH_LIMIT} levels deep"),
    ("trtllm", "deep.json", '{"a": ' + "{\"b\": " * 20_000 + "1" + "}" * 20_000 + "}",
     f"nested more than {DEPTH_LIMIT} levels deep"),
], ids=["vllm-alias-bomb", "trtllm-alias-bomb", "yaml-deep", "yaml-json-string-deep",
        "json-deep", "trtllm-json-deep"])
def test_alias_bombs_and_deep_nesting_in_a_config_are_refused(tmp_path, engine, name, text, says):
    config = tmp_path / name
    config.write_text(text)
    recommendation = tmp_path / "reco.json"
    settings = {"cpu_tier_bytes": 4 * GiB}
    if engine == "trtllm" and name.endswith(".json"):
        settings["retention_classes"] = {"chat": 80}
    recommendation.write_text(json.dumps({"settings": settings}))
    before = snapshot(tmp_path)
    refused(push(recommendation, config, engine), says, tmp_path, before)


def test_a_deeply_nested_recommendation_is_refused(tmp_path):
    recommendation = tmp_path / "reco.json"
    recommendation.write_text('{"settings": {}, "evidence": ' + "[" * 20_000 + "]" * 20_000 + "}")
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE)
    before = snapshot(tmp_path)
    refused(push(recommendation, config),
            f"recommendation {recommendation} is nested more than {DEPTH_LIMIT} levels", tmp_path, before)


# ---------------------------------------------------------------- work linear in the file
# Counted, not timed (benchmarks/push_edit.py times it): how often the file is parsed, and
# how many key comparisons an edit of a mapping of n keys makes.


def test_a_yaml_push_parses_the_file_once(tmp_path, monkeypatch):
    from ruamel.yaml import YAML

    from kvtier.policy.writers.push import plan
    from kvtier.policy.writers.settings import EngineSettings, Guardrails

    config = tmp_path / "serve.yaml"
    config.write_text(SERVE + "kv-events-config: '{\"enable_kv_cache_events\": false}'\nport: 8000\n")
    loads = []
    real_load = YAML.load
    monkeypatch.setattr(YAML, "load", lambda self, text: loads.append(1) or real_load(self, text))
    plan(EngineSettings(cpu_tier_bytes=GiB, kv_events=True), Guardrails(), "vllm", config)
    assert len(loads) == 1


def test_an_edit_of_a_mapping_compares_keys_in_proportion_to_its_size(tmp_path, monkeypatch):
    import kvtier.policy.writers.yamledit as yamledit
    from kvtier.policy.writers.push import plan
    from kvtier.policy.writers.settings import EngineSettings, Guardrails

    compared = []
    real = yamledit.norm_key
    monkeypatch.setattr(yamledit, "norm_key", lambda key: compared.append(1) or real(key))

    def comparisons(keys: int) -> int:
        config = tmp_path / f"serve-{keys}.yaml"
        config.write_text("model: m\nkv-transfer-config:\n  kv_connector: OffloadingConnector\n"
                          "  kv_role: kv_both\n  kv_connector_extra_config:\n"
                          "    cpu_bytes_to_use: 1\n"
                          + "".join(f"    site_key_{i}: {i}\n" for i in range(keys)))
        compared.clear()
        plan(EngineSettings(cpu_tier_bytes=GiB), Guardrails(), "vllm", config)
        return len(compared)

    small, large = comparisons(200), comparisons(800)
    assert large <= 4.5 * small, (small, large)  # 4x the keys: 4x the work, not 16x
