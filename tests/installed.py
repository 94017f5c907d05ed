"""kvtier as a user has it: the wheel built from this checkout, installed non-editable into a
clean venv, run from a folder outside the checkout with nothing of the checkout on the import
path. Tests that start a verb the way a user does take the ``installed`` fixture (tests/conftest.py).

The wheel is built once per test session (``pip wheel --no-build-isolation``, the Cython
extensions compile: a couple of minutes) from a copy of the checkout's files, so nothing left in
the checkout's ``build/`` folder reaches it. The clean venv gets the wheel ``--no-deps``; its
third-party dependencies (duckdb, streamlit, torch, ...) come from the test run's own environment
through a ``.pth`` line, *after* the venv's own site-packages. A folder named by a ``.pth`` line
has its own ``.pth`` files ignored, so the test environment's editable kvtier (a finder that a
``.pth`` file installs) cannot come through: ``kvtier`` resolves to the wheel alone, which each
use checks (``Installed.check_origin``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Built:
    wheel: Path
    names: tuple[str, ...]  # the files in the wheel
    log: str                # pip's verbose output while building it


@dataclass(frozen=True)
class DemoRun:
    """What ``kvtier demo`` wrote (``out``) and printed (``stdout``)."""

    out: Path
    stdout: str


@dataclass(frozen=True)
class Installed:
    """The installed kvtier: its venv's python, the ``kvtier`` console script, a working folder
    outside the checkout and the environment to run them in (no ``PYTHON*`` variables)."""

    python: Path
    kvtier: Path
    away: Path
    env: dict[str, str]

    @property
    def site_packages(self) -> str:
        return site_packages(self.python)

    def run(self, *args: str, timeout_s: float = 300.0, cwd: Path | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """``kvtier ARGS`` from the folder outside the checkout; it must exit 0 when ``check``."""
        done = subprocess.run([str(self.kvtier), *args], capture_output=True, text=True,
                              cwd=cwd or self.away, env=self.env, timeout=timeout_s, check=False)
        if check:
            assert done.returncode == 0, (f"kvtier {' '.join(args)} exited {done.returncode}:\n"
                                          f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return done

    def popen(self, *args: str, **kwargs) -> subprocess.Popen:
        """``kvtier ARGS`` started from the folder outside the checkout, in its own session."""
        return subprocess.Popen([str(self.kvtier), *args], cwd=self.away, env=self.env,
                                start_new_session=True, **kwargs)

    def check_origin(self) -> None:
        """``kvtier`` and its parts load from the clean venv, not from the checkout."""
        code = ("import json, kvtier, kvtier.dashboard, kvtier.collector.events as e; "
                "print(json.dumps([kvtier.__file__, kvtier.dashboard.__file__, e.__file__]))")
        out = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True,
                             cwd=self.away, env=self.env, check=True).stdout
        for path in json.loads(out.strip().splitlines()[-1]):
            assert path.startswith(self.site_packages), f"{path} loaded from outside the clean venv"


def run(command: list[str], *, stdout_only: bool = False, **kwargs) -> str:
    """The command's output (stdout and stderr, or stdout only); it must succeed."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{output[-4000:]}"
    return done.stdout if stdout_only else output


def site_packages(python: Path) -> str:
    return run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               stdout_only=True).strip()


def copy_checkout(target: Path) -> None:
    """The checkout's files (tracked, and new ones git does not ignore), without build output."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def build_wheel(source: Path, out: Path) -> Built:
    copy_checkout(source)
    log = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
               "-w", str(out), str(source)])
    wheels = list(out.glob("kvtier-*.whl"))
    assert len(wheels) == 1, f"expected one kvtier wheel in {out}, found {wheels}"
    with zipfile.ZipFile(wheels[0]) as wheel:
        return Built(wheels[0], tuple(wheel.namelist()), log)


def clean_venv(venv: Path, wheels: list[Path], *, dependencies: bool) -> Path:
    """A fresh venv holding ``wheels`` (installed ``--no-deps``, in order); with
    ``dependencies``, the test environment's site-packages after its own (see the module doc)."""
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--no-index", *map(str, wheels)])
    if dependencies:
        (Path(site_packages(python)) / "kvtier-test-dependencies.pth").write_text(
            sysconfig.get_paths()["purelib"] + "\n")
    return python


def user_environment() -> dict[str, str]:
    """The test run's environment without anything that points Python at the checkout."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith("PYTHON") and key != "VIRTUAL_ENV"}


def install(built: Built, work: Path) -> Installed:
    python = clean_venv(work / "venv", [built.wheel], dependencies=True)
    away = work / "home"
    away.mkdir()
    installed = Installed(python, python.parent / "kvtier", away, user_environment())
    assert installed.kvtier.is_file(), "the wheel installed no kvtier console script"
    installed.check_origin()
    return installed
