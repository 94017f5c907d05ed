"""Shared fixtures: fresh stores per test, a fixed clock, free ports, system binaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.collector.events import Origin
from kvtier.collector.store import TraceStore

REPO = Path(__file__).resolve().parent.parent


class FixedClock:
    """A clock tests move by hand."""

    def __init__(self, now_s: float = 1_800_000_000.0):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def store(clock) -> TraceStore:
    with TraceStore(":memory:", clock=clock) as s:
        yield s


@pytest.fixture
def file_store(tmp_path, clock) -> TraceStore:
    with TraceStore(tmp_path / "store.duckdb", clock=clock) as s:
        yield s


@pytest.fixture
def host_headroom(monkeypatch):
    """``host_headroom(n)``: this host's memory headroom reads as ``n`` bytes to recommend and
    push (they measure /proc otherwise, which differs from machine to machine)."""

    def set_to(headroom_bytes: int) -> None:
        from kvtier.policy.recommend.headroom import HostLimit

        monkeypatch.setattr("kvtier.host.measured_host_limit",
                            lambda root="/": HostLimit(headroom_bytes, 0, "the test's host"))

    return set_to


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory):
    """kvtier's wheel, built once per session from a copy of the checkout (tests/installed.py)."""
    from tests.installed import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel-source"), tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def installed(built_wheel, tmp_path_factory):
    """kvtier as a user has it: the wheel in a clean venv, run from outside the checkout."""
    from tests.installed import install

    return install(built_wheel, tmp_path_factory.mktemp("installed"))


@pytest.fixture(scope="session")
def installed_demo(installed):
    """``kvtier demo`` run once from the install, outside the checkout: its output folder (a
    store, segments, a recommendation) and what it printed; the user-path tests and the
    dashboard's browser test read it."""
    from tests.installed import DemoRun

    out = installed.away / "demo"
    done = installed.run("demo", "--out", str(out), "--requests", "120", "--chat-requests", "0",
                         timeout_s=420)
    return DemoRun(out, done.stdout)


@pytest.fixture
def origin() -> Origin:
    return Origin(engine="reference", instance="node-1", source="node-1/test")


def require_binary(name: str) -> str:
    """The path of a system binary a test needs. Missing: skip locally, fail in CI (CI=true),
    where ``make test`` installs it and a skip would hide a broken set-up."""
    import os
    import shutil

    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (scripts/system-deps.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


ANY_PORT = "tcp://127.0.0.1:0"  # a ZMQ endpoint a tap binds on a port the kernel picks


def bound_to(line: str) -> str | None:
    """The endpoint a ``kvtier collect`` line says a tap bound (``kvtier collect: tap HooksTap
    started (tcp://127.0.0.1:0), bound to tcp://127.0.0.1:P``); ``None`` for another line. A
    test gives a collector port 0 and reads the port back from it, so no port is raced for."""
    marker = ", bound to "
    return line.rsplit(marker, 1)[1].split(",")[0].strip() if " started (" in line and marker in line else None


def free_port() -> int:
    """A loopback TCP port free right now, outside the kernel's ephemeral range; for a port
    that must be known before anything binds it (an engine shipping before its collector
    starts, a third-party server that does not say which port it bound). Where kvtier binds,
    give it port 0 and read the port back (:func:`bound_to`, a service's ``url``): a port
    picked here can be taken by another process before it is bound.

    Outside it, because several endpoints here are connected to before they are bound (an
    engine's ZMQ socket retries every 100 ms until the collector binds): a retried connect to
    127.0.0.1:P that the kernel gives the ephemeral source port P connects to itself (TCP
    simultaneous open) and holds P, so the bind fails with "address already in use". The
    kernel hands out source ports from the ephemeral range only."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    floor = 10000 if low > 12000 else 1024
    for _ in range(200):
        port = random.randrange(floor, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port between {floor} and {low}")
