"""Peers' environments and processes for the peer tests (marker ``peer``).

Each peer runs from its own virtualenv, built by ``make`` (``scripts/lmcache-env.sh``,
``scripts/dynamo-env.sh``) and named to pytest by an environment variable; without it the
tests skip and say how to get it. :class:`PeerProcess` runs one server of a peer with its
output in a log file, waits for it to answer, and stops it by its process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


def peer_python(variable: str, make_target: str) -> Path:
    """The peer environment's python named by ``$variable``; skip when it is unset or missing."""
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"{variable} is not set: the peer environment is built and named by "
                    f"`make test` (make {make_target})")
    python = Path(value)
    if not python.is_file():
        pytest.skip(f"{variable}={value} does not exist: build it with `make {make_target}`")
    return python


class PeerProcess:
    """One server of a peer, started in its own process group, output to ``log``."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None):
        self.log = log
        self._out = open(log, "wb")
        self.process = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})},
                                        start_new_session=True)

    def wait_http(self, url: str, timeout_s: float = 120.0) -> bytes:
        """GET ``url`` until it answers 200; fail with the log's tail when the process exits
        or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{self.process.args[:3]} exited {self.process.returncode}:\n"
                            f"{self.tail()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    return answer.read()
            except OSError:  # not listening yet, or an error status
                pass
            time.sleep(0.5)
        pytest.fail(f"{url} did not answer in {timeout_s:g} s:\n{self.tail()}")

    def tail(self, chars: int = 4000) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)
        self._out.close()
