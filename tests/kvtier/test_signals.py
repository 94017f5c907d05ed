"""Every verb that starts children or servers stops them, and keeps what it recorded, on
SIGTERM (what a service manager sends) and SIGHUP (a closed terminal) as on Ctrl-C.

Each test runs the real verb as ``python -m kvtier VERB`` in its own session, waits until it
serves, sends the signal to the verb's own process (not its group: a service manager signals
the main process), and checks that it exits and that no process it started is left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from kvtier.signals import Stopped, stop_on_signals
from tests.conftest import REPO, free_port

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def start():
    """``start(*argv)`` runs ``python -m kvtier ARGV`` in its own session; whatever a test
    leaves running (it failed before its signal, or a child survived) is killed afterwards,
    with everything below it."""
    started: list[subprocess.Popen] = []

    def run(*argv: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-m", "kvtier", *argv],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=ENV, start_new_session=True)
        started.append(process)
        return process

    yield run
    for process in started:
        below = descendants(process.pid) if process.poll() is None else set()
        for pid in below:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)  # its session's group, children included
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)


def wait_for_line(process: subprocess.Popen, marker: str, timeout_s: float = 90.0) -> list[str]:
    """Lines of stdout up to the first that holds ``marker``."""
    lines, done = [], threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if marker in line:
                done.set()
                return

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(timeout_s):
        process.kill()
        raise AssertionError(f"no {marker!r} within {timeout_s} s; got {''.join(lines)!r}, "
                             f"stderr {process.stderr.read()!r}")
    return lines


def engine_port(lines: list[str]) -> int:
    """The port ``kvtier engine --port 0`` got, from its line ``reference engine on
    http://127.0.0.1:P (...)``."""
    return int(lines[-1].split("reference engine on ", 1)[1].split()[0].rsplit(":", 1)[1])


def wait_healthy(url: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not up after {timeout_s} s")


def stop_and_check(process: subprocess.Popen, sig: int, started: set[int]) -> tuple[int, str]:
    """Signal the verb, wait for it, assert nothing it started survives; (exit code, stderr)."""
    process.send_signal(sig)
    try:
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    left = sorted(pid for pid in started if alive(pid))
    for pid in left:  # do not leak them into other tests
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left after {signal.Signals(sig).name}: {left}"
    return code, process.stderr.read()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_dashboard_leaves_no_streamlit_process(start, tmp_path, sig):
    pytest.importorskip("streamlit")
    port = free_port()  # Streamlit binds the port it is given and names no port it picked
    process = start("dashboard", "--segments", str(tmp_path), "--port", str(port))
    wait_healthy(f"http://127.0.0.1:{port}/_stcore/health")
    started = descendants(process.pid)
    assert started, "the dashboard serves from a child process"
    code, stderr = stop_and_check(process, sig, started)
    assert code == 0, stderr
    with pytest.raises(OSError):  # nothing listens on the port any more
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_engine_flushes_its_store_and_closes_its_port(start, tmp_path, sig):
    process = start("engine", "--port", "0", "--gpu-blocks", "16", "--cpu-blocks", "8",
                    "--store", str(tmp_path / "store.duckdb"))
    port = engine_port(wait_for_line(process, "reference engine on"))
    body = b'{"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], "max_tokens": 2}'
    for _ in range(3):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body)
        urllib.request.urlopen(request, timeout=60).read()
    code, stderr = stop_and_check(process, sig, descendants(process.pid))
    assert code == 0, stderr
    from kvtier.collector.store import TraceStore

    with TraceStore(tmp_path / "store.duckdb") as store:
        assert store.count("requests") == 3  # every finished request reached the store


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_collect_stops_and_reports_its_store(start, tmp_path, sig):
    process = start("collect", "--store", str(tmp_path / "c.duckdb"), "--metrics-port", "0",
                    "--segments", str(tmp_path / "segments"))
    wait_for_line(process, "kvtier collect: metrics at")
    started = descendants(process.pid)
    process.send_signal(sig)
    code = process.wait(timeout=60)
    said = process.stdout.read()
    assert code == 0 and "kvtier collect: stopped" in said, (code, said, process.stderr.read())
    assert not [pid for pid in started if alive(pid)]
    assert (tmp_path / "c.duckdb").exists()


@pytest.mark.timeout(240)
def test_demo_stops_its_engine_and_keeps_what_it_stored(start, tmp_path):
    process = start("demo", "--out", str(tmp_path / "out"), "--requests", "300", "--no-recommendation")
    wait_for_line(process, "load:", timeout_s=150)
    time.sleep(3)  # mid-phase: requests in flight, rows waiting in the recorder
    code, stderr = stop_and_check(process, signal.SIGTERM, descendants(process.pid))
    assert code == 128 + signal.SIGTERM and "stopped by SIGTERM" in stderr, stderr
    from kvtier.collector.store import TraceStore

    with TraceStore(tmp_path / "out" / "kvtier.duckdb") as store:  # closed cleanly, readable
        assert store.count("block_events") > 0


@pytest.mark.timeout(240)
def test_rollout_stops_on_sighup(start, tmp_path):
    engine = start("engine", "--port", "0", "--gpu-blocks", "48")
    try:
        port = engine_port(wait_for_line(engine, "reference engine on"))
        process = start("rollout", "--endpoint", f"http://127.0.0.1:{port}", "--requests", "200",
                        "--gpu-blocks", "48", "--cpu-blocks", "64", "--cold-blocks", "0")
        time.sleep(8)
        code, stderr = stop_and_check(process, signal.SIGHUP, descendants(process.pid))
        assert code == 128 + signal.SIGHUP and "stopped by SIGHUP" in stderr, stderr
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.wait(timeout=60)


def test_stop_on_signals_raises_stopped_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as raised, stop_on_signals():
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)  # the handler raises before this ends
    assert raised.value.signum == signal.SIGHUP and isinstance(raised.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is before
