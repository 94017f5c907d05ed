"""`kvtier push` as a transaction: two pushes at once, files that are not plain config files,
links, line ends and byte-order marks, connectors kvtier does not own, documents it does not
write. Each scenario runs the command line, as an operator would."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.cli import main
from kvtier.policy.recommend.recommendation import KIND, VERSION

GiB = 1 << 30
ROOMY = ["--host-headroom-bytes", str(1 << 40)]  # this host's memory is not under test
SERVE = """\
# chat fleet
model: m   # the model
kv-transfer-config:
  kv_connector: OffloadingConnector
  kv_role: kv_both
  kv_connector_extra_config:
    cpu_bytes_to_use: 1073741824
    eviction_policy: lru
port: 8000
"""


def recommendation(tmp_path: Path, name: str = "reco.json", **settings) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"kind": KIND, "version": VERSION,
                                "settings": settings or {"cpu_tier_bytes": 4 * GiB}}))
    return path


def push(reco: Path, config: Path, *extra: str) -> int:
    return main(["push", "--recommendation", str(reco), "--engine", "vllm",
                 "--config", str(config), *ROOMY, *extra])


def backups(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(".bak"))


# ---------------------------------------------------------------- two pushes at once

# Runs one push whose apply waits until both pushes have planned: both diffs are made
# from the original file, then both try to write it.
RACER = """
import sys, time
from pathlib import Path
import kvtier.policy.writers.push as push_module
from kvtier.cli import main

folder, me = Path(sys.argv[1]), sys.argv[2]
real_apply = push_module.apply

def apply_after_both_planned(plan, **kwargs):
    (folder / f"planned-{me}").touch()
    while len(list(folder.glob("planned-*"))) < 2:
        time.sleep(0.01)
    return real_apply(plan, **kwargs)

push_module.apply = apply_after_both_planned
sys.exit(main(sys.argv[3:]))
"""


def test_two_pushes_at_once_one_wins_the_other_says_why_and_the_original_is_kept(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE)
    sync = tmp_path / "sync"
    sync.mkdir()
    racers = [subprocess.Popen(
        [sys.executable, "-c", RACER, str(sync), str(i), "push", "--recommendation",
         str(recommendation(tmp_path, f"r{i}.json", cpu_tier_bytes=(i + 2) * GiB)),
         "--engine", "vllm", "--config", str(config), *ROOMY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    results = [(r.wait(timeout=120), r.stdout.read(), r.stderr.read()) for r in racers]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    (_, winner_out, _), = [r for r in results if r[0] == 0]
    (_, _, loser_err), = [r for r in results if r[0] == 2]
    assert len(loser_err.splitlines()) == 1
    assert ("another kvtier push is writing" in loser_err
            or "changed after kvtier read it" in loser_err), loser_err
    assert "nothing written" in loser_err
    (backup,) = backups(tmp_path)
    assert backup.read_text() == SERVE and f"backup: {backup}" in winner_out
    (written,) = [l for l in winner_out.splitlines() if l.startswith("+    cpu_bytes_to_use")]
    assert config.read_text() == SERVE.replace("    cpu_bytes_to_use: 1073741824", written[1:])


def test_a_push_while_another_holds_the_lock_stops_and_changes_nothing(tmp_path, capsys):
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE)
    with open(tmp_path / ".serve.yaml.kvtier-lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert push(recommendation(tmp_path), config) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "another kvtier push is writing" in line and "nothing written" in line
    assert config.read_text() == SERVE and backups(tmp_path) == []


def test_backups_of_pushes_in_one_second_never_share_a_name(tmp_path):
    from kvtier.policy.writers.push import apply, plan
    from kvtier.policy.writers.settings import EngineSettings, Guardrails

    config = tmp_path / "serve.yaml"
    config.write_text(SERVE)
    texts = [SERVE]
    for size in (2, 3, 4):  # the same clock reading each time
        done = apply(plan(EngineSettings(cpu_tier_bytes=size * GiB), Guardrails(), "vllm", config),
                     clock=lambda: 1_800_000_000.0)
        assert done is not None
        texts.append(config.read_text())
    assert [b.read_text() for b in backups(tmp_path)] == texts[:3]
    assert len({b.name for b in backups(tmp_path)}) == 3


# ---------------------------------------------------------------- what the config is


def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "serve.yaml"
    os.mkfifo(fifo)
    done = subprocess.run(  # a push that opened the FIFO would wait for a writer forever
        [sys.executable, "-m", "kvtier", "push", "--recommendation", str(recommendation(tmp_path)),
         "--engine", "vllm", "--config", str(fifo), *ROOMY],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "is a FIFO (named pipe)" in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_link_to_a_device_is_refused(tmp_path, capsys):
    link = tmp_path / "serve.yaml"
    link.symlink_to("/dev/null")
    assert push(recommendation(tmp_path), link) == 2
    assert "is a character device" in capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == "/dev/null"


def test_a_linked_config_is_edited_through_the_link_and_stays_a_link(tmp_path, capsys):
    real = tmp_path / "deploy" / "serve-v3.yaml"
    real.parent.mkdir()
    real.write_text(SERVE)
    link = tmp_path / "serve.yaml"
    link.symlink_to(real)
    assert push(recommendation(tmp_path), link) == 0
    out = capsys.readouterr().out
    assert link.is_symlink() and link.resolve() == real
    assert "cpu_bytes_to_use: 4294967296" in real.read_text()
    (note,) = [l for l in out.splitlines() if "is a link" in l]
    assert str(real) in note and "keeps the link" in note
    (backup,) = backups(real.parent)
    assert backup.read_text() == SERVE and backups(tmp_path) == []


def test_crlf_line_ends_stay_and_the_diff_shows_only_the_change(tmp_path, capsys):
    config = tmp_path / "serve.yaml"
    config.write_bytes(SERVE.replace("\n", "\r\n").encode())
    assert push(recommendation(tmp_path), config) == 0
    raw = config.read_bytes()
    assert raw.count(b"\r\n") == raw.count(b"\n") == SERVE.count("\n")
    assert raw.decode() == SERVE.replace("1073741824", "4294967296").replace("\n", "\r\n")
    changed = [l for l in capsys.readouterr().out.splitlines()
               if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    assert changed == ["-    cpu_bytes_to_use: 1073741824", "+    cpu_bytes_to_use: 4294967296"]


def test_a_yaml_with_a_byte_order_mark_is_read_and_keeps_it(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_bytes(b"\xef\xbb\xbf" + SERVE.encode())
    assert push(recommendation(tmp_path), config) == 0
    assert config.read_bytes() == b"\xef\xbb\xbf" + SERVE.replace("1073741824", "4294967296").encode()


def test_an_empty_json_config_is_an_error_not_an_empty_object(tmp_path, capsys):
    config = tmp_path / "kv-transfer.json"
    config.write_text("")
    assert push(recommendation(tmp_path), config) == 2
    assert "the file is empty" in capsys.readouterr().err and config.read_text() == ""


def test_extra_config_written_as_a_string_names_the_key(tmp_path, capsys):
    config = tmp_path / "kv-transfer.json"
    text = json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": "cpu_bytes_to_use=5"})
    config.write_text(text)
    assert push(recommendation(tmp_path), config) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "kv_connector_extra_config must be a mapping" in line and "sequence element" not in line
    assert config.read_text() == text


# ---------------------------------------------------------------- what it may replace


LMCACHE = """\
model: m
kv-transfer-config: '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}'
"""


def test_another_connector_is_replaced_only_with_force(tmp_path, capsys):
    config = tmp_path / "serve.yaml"
    config.write_text(LMCACHE)
    reco = recommendation(tmp_path)
    assert push(reco, config) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "'LMCacheConnectorV1'" in line and "add --force" in line
    assert config.read_text() == LMCACHE and backups(tmp_path) == []
    assert push(reco, config, "--force") == 0
    from kvtier.policy.writers.yamledit import yaml_get

    transfer = json.loads(yaml_get(config.read_text(), ("kv-transfer-config",)))
    assert transfer["kv_connector"] == "OffloadingConnector"
    assert transfer["kv_connector_extra_config"] == {"cpu_bytes_to_use": 4 * GiB}


@pytest.mark.parametrize("head, says", [
    ({"kind": "kvtier-next-use", "version": VERSION}, "is a 'kvtier-next-use' document"),
    ({"kind": KIND, "version": VERSION + 1}, f"reads version {VERSION}"),
    ({"kind": KIND}, "is a version None recommendation"),
    ({"version": VERSION}, "is a None document"),
])
def test_a_document_kvtier_does_not_write_is_refused(tmp_path, capsys, head, says):
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE)
    reco = tmp_path / "reco.json"
    reco.write_text(json.dumps({**head, "settings": {"cpu_tier_bytes": GiB}}))
    assert push(reco, config) == 2
    assert says in capsys.readouterr().err and config.read_text() == SERVE


def test_running_out_of_memory_names_no_flag_push_lacks(tmp_path, capsys, monkeypatch):
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE)

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("kvtier.policy.writers.push.plan", no_memory)
    assert push(recommendation(tmp_path), config) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "out of memory" in line and "nothing changed" in line and "--max-requests" not in line


def test_help_says_what_push_keeps_and_changes_with_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["push", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for words in ("What it changes:", "What it keeps:", "KvtierOffloadingConnector",
                  "never adds one", "--force", "example:", "kvtier push --recommendation"):
        assert words in out
