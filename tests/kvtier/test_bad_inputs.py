"""Every failure path ends cleanly: the bad-input table (``bad_input_cases.py``) run through
the real command line, and what read-only verbs, a locked store and a closed pipe must do.

For every row: the exit code (2 bad input, 1 runtime failure), exactly one line on stderr
(two for argparse: its short usage line, then the error) naming the flag or file, no
traceback, and every file in the case's folder byte-identical afterwards, with no backup or
temporary file left.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.kvtier.bad_input_cases import CASES
from tests.kvtier.bad_input_files import build

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def files(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("bad-input-files"))


def kvtier(argv: list[str], cwd: Path, timeout_s: float = 90, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "kvtier", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout_s, **kwargs)


def checksums(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and os.access(p, os.R_OK)}


def make_immutable(path: Path) -> Callable:
    """``chattr +i`` (root too cannot write then); else read-only modes for a non-root user."""
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
        return lambda: subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    if os.geteuid() == 0:
        pytest.skip("chattr +i is not available here, and root ignores read-only modes")
    mode = path.stat().st_mode
    path.chmod(0o555 if path.is_dir() else 0o444)
    return lambda: path.chmod(mode)


def hold_lock(path: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
        "time.sleep(120)"), str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@contextlib.contextmanager
def arranged(setup: tuple[str, ...], work: Path):
    undo, subst = [], {}
    try:
        for step in setup:
            kind, _, arg = step.partition(":")
            if kind == "busy":
                held = socket.socket()
                held.bind(("127.0.0.1", 0))
                held.listen(1)
                undo.append(held.close)
                subst["PORT"] = str(held.getsockname()[1])
            elif kind == "lock":
                holder = hold_lock(work / arg)
                undo.append(lambda h=holder: (h.kill(), h.wait()))
            elif kind == "ro":
                undo.append(make_immutable(work / arg))
            elif kind == "file":
                (work / arg).write_text("I am a file\n")
            elif kind == "dir":
                (work / arg).mkdir()
            elif kind == "copy":
                source, target = arg.split("=")
                shutil.copy(work / source, work / target)
            else:
                raise ValueError(f"unknown set-up {step!r}")
        yield subst
    finally:
        for step in reversed(undo):
            step()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_bad_input_is_one_clear_line_and_changes_nothing(case, files, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(files, work)
    with arranged(case.setup, work) as subst:
        before = checksums(work)
        result = kvtier(shlex.split(case.argv.format(**subst)), work)
        after = checksums(work)
    err = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == case.code, result.stderr
    assert len(err) == case.lines, err
    if case.lines == 2:
        assert err[0].startswith("usage: kvtier") and len(err[0]) < 120
    verb = case.argv.split()[0]
    assert err[-1].startswith((f"kvtier {verb}", "kvtier: error:")) and ": error: " in err[-1], err
    assert case.says.format(**subst) in err[-1], err
    changed = [name for name, digest in before.items() if after.get(name) != digest]
    assert not changed, f"changed or removed: {changed}"
    left = [name for name in after.keys() - before.keys() if name.endswith((".bak", ".tmp"))]
    assert not left, f"left behind: {left}"


def test_the_table_covers_every_verb_with_at_least_sixty_cases():
    from kvtier.cli import VERBS

    verbs = {c.argv.split()[0] for c in CASES}
    assert set(VERBS) <= verbs and len(CASES) >= 60
    assert {c.code for c in CASES} == {1, 2}


@pytest.mark.parametrize("argv", [
    "store info stores/kvtier.duckdb", "store info stores/kvtier.duckdb --json",
    "store prune stores/kvtier.duckdb --max-age 0 --dry-run",
    "analyze --store stores/kvtier.duckdb",
    "simulate --trace stores/kvtier.duckdb --gpu-tokens 100000",
    "evaluate --trace stores/kvtier.duckdb --gpu-tokens 8192 --cpu-tokens 16384 --policies lru",
    "recommend --store stores/kvtier.duckdb --engine vllm --host-headroom-bytes 1099511627776 --out reco-out",
    "analyze --trace stores/segments",
])
@pytest.mark.parametrize("immutable", [False, True], ids=["writable", "immutable"])
def test_read_only_verbs_leave_every_file_they_read_byte_identical(files, tmp_path, argv, immutable):
    work = tmp_path / "work"
    shutil.copytree(files, work)
    stores = work / "stores"
    before, names = checksums(stores), sorted(p.name for p in stores.iterdir())
    with arranged(("ro:stores/kvtier.duckdb",) if immutable else (), work):
        result = kvtier(shlex.split(argv), work)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    assert checksums(stores) == before  # every byte of the store and its segments
    assert sorted(p.name for p in stores.iterdir()) == names  # no WAL or lock file beside it


def test_a_store_held_by_a_running_collector_is_read_through_its_segments(files, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(files, work)
    store = work / "stores" / "lonely" / "kvtier.duckdb"  # no segments/ beside it
    collector = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "collect", "--store", str(store), "--segments", "live",
         "--export-every-s", "0.5", "--metrics-port", "0", "--duration-s", "60"], cwd=work,
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    try:
        assert "storing into" in collector.stdout.readline()
        for _ in range(100):  # its first export writes the rows the store already holds
            if list((work / "live" / "requests").rglob("*.parquet")):
                break
            time.sleep(0.1)
        result = kvtier(["analyze", "--store", str(store), "--json"], work)
        alone = kvtier(["analyze", "--store", "stores/kvtier.duckdb", "--json"], work)
        info = kvtier(["store", "info", str(store), "--json"], work)
    finally:
        collector.terminate()
        collector.wait(30)
    assert result.returncode == 0, result.stderr
    (note,) = result.stderr.splitlines()
    assert note.startswith(f"kvtier analyze: note: {store} is held by process {collector.pid}")
    assert f"reading its Parquet segments in {(work / 'live').resolve()} instead" in note
    import json

    assert json.loads(result.stdout)["trace"]["requests"] == 120
    assert json.loads(alone.stdout)["trace"]["requests"] == 120  # the same rows, unlocked
    assert info.returncode == 0, info.stderr  # store info too, from the same segments
    assert info.stderr.startswith(f"kvtier store: note: {store} is held by process {collector.pid}")
    assert json.loads(info.stdout)["requests"] == 120
    assert not (store.parent / "kvtier.duckdb.segments.json").exists()  # removed when it stopped


def test_verbose_adds_the_traceback_after_the_line(files, tmp_path):
    (tmp_path / "outfile").write_text("x")
    result = kvtier(["--verbose", "analyze", "--trace", str(files / "traces" / "mc300.jsonl"),
                     "--out", "outfile"], tmp_path)
    lines = result.stderr.splitlines()
    assert result.returncode == 2
    assert lines[0] == "kvtier analyze: error: --out outfile is a file; give a folder (it is created if missing)"
    assert "Traceback (most recent call last)" in result.stderr


@pytest.mark.parametrize("argv", ["analyze --trace traces/mc300.jsonl",
                                  "store info stores/kvtier.duckdb --json",
                                  "simulate --trace traces/mc300.jsonl --sweep 1e4,1e5,1e6"])
def test_a_reader_that_closes_the_pipe_ends_it_quietly(files, argv):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = f"{shlex.quote(sys.executable)} -m kvtier {argv} | head -c 10 > /dev/null; exit ${{PIPESTATUS[0]}}"
    result = subprocess.run(["bash", "-c", command], cwd=files, env=env, capture_output=True,
                            text=True, timeout=90)
    assert result.returncode in (0, 141) and result.stderr == ""
