"""`kvtier push` and who owns the config: a file the user may not write is refused, though its
folder would let a rename replace it; a replaced file keeps its mode, and its owner and
group as far as the user may give them, and a note says what it cannot keep.

The pushes run as a real unprivileged user (uid 65534, "nobody" on most systems) in a
subprocess that drops root's privileges (``os.setuid``) before it pushes; the tests set the
files up as root, as an administrator would. Where the tests
themselves run unprivileged, the read-only case runs as that user and the others skip."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvtier.policy.recommend.recommendation import KIND, VERSION

GiB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]
UNPRIVILEGED = 65534
AS_ROOT = os.geteuid() == 0
SERVE = ("model: m\nkv-transfer-config: '{\"kv_connector\": \"OffloadingConnector\", "
         "\"kv_role\": \"kv_both\", \"kv_connector_extra_config\": {\"cpu_bytes_to_use\": 1}}'\n")
needs_root = pytest.mark.skipif(not AS_ROOT, reason="only root can set up another user's files")


@pytest.fixture
def folder():
    """A folder the unprivileged user may write (pytest's own tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="kvtier-push-owner-"))
    if AS_ROOT:
        os.chown(path, UNPRIVILEGED, UNPRIVILEGED)
    yield path
    shutil.rmtree(path)


# The interpreter lives under /root (0700 here), which the unprivileged user cannot reach, so
# the child starts as root, loads every module a push uses with a dry run on a scratch copy,
# then drops to the user (groups, group, user) before the push under test touches a file.
AS_USER = """
import contextlib, io, os, shutil, sys
from kvtier.cli import main
uid, argv = int(sys.argv[1]), sys.argv[2:]
scratch = argv[argv.index("--config") + 1] + ".warm-up.yaml"
shutil.copy(argv[argv.index("--config") + 1], scratch)
with contextlib.redirect_stdout(io.StringIO()):
    main(argv[:argv.index("--config")] + ["--config", scratch, "--dry-run"] + argv[argv.index("--config") + 2:])
os.unlink(scratch)
os.setgroups([uid]); os.setgid(uid); os.setuid(uid)
sys.exit(main(argv))
"""


def push(folder: Path, config: Path, *, as_user: bool) -> subprocess.CompletedProcess:
    reco = folder / "reco.json"
    reco.write_text(json.dumps({"kind": KIND, "version": VERSION,
                                "settings": {"cpu_tier_bytes": 4 * GiB}}))
    reco.chmod(0o644)
    argv = ["push", "--recommendation", str(reco), "--engine", "vllm", "--config", str(config),
            "--host-headroom-bytes", str(1 << 40)]
    command = ([sys.executable, "-c", AS_USER, str(UNPRIVILEGED), *argv] if as_user and AS_ROOT
               else [sys.executable, "-m", "kvtier", *argv])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=folder)


def owned(path: Path) -> tuple[int, int, int]:
    info = path.stat()
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


def test_a_config_the_user_may_not_write_is_refused_and_kept_as_it_was(folder):
    config = folder / "serve.yaml"
    config.write_text(SERVE)
    config.chmod(0o444)  # root's (or, unprivileged, the user's own) read-only file
    before = owned(config)
    done = push(folder, config, as_user=True)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert f"{config} is read-only for you" in line and "mode 0444" in line, line
    assert config.read_text() == SERVE and owned(config) == before
    assert sorted(p.name for p in folder.iterdir()) == ["reco.json", "serve.yaml"]


@needs_root
def test_root_keeps_the_owner_group_and_mode_of_a_file_it_replaces(folder):
    config = folder / "serve.yaml"
    config.write_text(SERVE)
    os.chown(config, UNPRIVILEGED, UNPRIVILEGED)
    config.chmod(0o640)
    done = push(folder, config, as_user=False)
    assert done.returncode == 0, done.stderr
    assert "4294967296" in config.read_text()
    assert owned(config) == (UNPRIVILEGED, UNPRIVILEGED, 0o640)
    assert "replaced by a new file" not in done.stdout  # nothing to say: all of it kept


@needs_root
def test_a_user_replacing_a_shared_file_keeps_its_group_and_mode_and_says_whose_it_becomes(folder):
    config = folder / "serve.yaml"
    config.write_text(SERVE)
    os.chown(config, 0, UNPRIVILEGED)  # root's, writable by the group the user is in
    config.chmod(0o664)
    done = push(folder, config, as_user=True)
    assert done.returncode == 0, done.stderr
    assert "4294967296" in config.read_text()
    assert owned(config) == (UNPRIVILEGED, UNPRIVILEGED, 0o664)
    (note,) = [line for line in done.stdout.splitlines() if "replaced by a new file" in line]
    assert "keeps its mode 0664" in note and "owner root becomes" in note, note
