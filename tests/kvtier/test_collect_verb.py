"""`kvtier collect` refuses to start when it cannot collect, at once and in one line."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(60)


def collect(tmp_path, *flags):
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "kvtier", "collect", "--store", str(tmp_path / "s.duckdb"),
                             "--duration-s", "1", *flags], capture_output=True, text=True, timeout=30)
    return result, time.monotonic() - started


@pytest.fixture
def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


@pytest.mark.parametrize("flag", ["--metrics-port", "--vllm-events"])
def test_a_busy_port_exits_1_within_seconds_naming_the_flag(tmp_path, busy_port, flag):
    value = str(busy_port) if flag == "--metrics-port" else f"tcp://127.0.0.1:{busy_port}"
    extra = [] if flag == "--metrics-port" else ["--metrics-port", "0"]
    result, took_s = collect(tmp_path, flag, value, *extra)
    assert result.returncode == 1 and took_s < 10
    assert result.stderr.splitlines() == [
        f"kvtier collect: error: {flag} {value}{' on 127.0.0.1' if flag == '--metrics-port' else ''}: "
        "address already in use (another kvtier or engine running?); stop it or pick another port "
        "(0: any free port)"]
    assert "running" not in result.stdout and "storing into" not in result.stdout


@pytest.mark.parametrize("flags, says", [
    (["--metrics-host", "nosuchhost.invalid"], "--metrics-host nosuchhost.invalid: unknown host"),
    (["--metrics-host", "10.255.255.1"], "--metrics-host 10.255.255.1: not an address of this machine"),
    (["--metrics-port", "0", "--vllm-events", "http://127.0.0.1:5557"], "--vllm-events: bad ZMQ endpoint"),
    (["--metrics-port", "0", "--trtllm-events", "notaurl"], "--trtllm-events 'notaurl' is not an http(s) URL"),
    (["--metrics-port", "0", "--duration-s", "-1"], "--duration-s must be a number > 0, got -1"),
])
def test_bad_addresses_and_values_exit_2(tmp_path, flags, says):
    result, _ = collect(tmp_path, *flags)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"kvtier collect: error: {says}")


def test_a_non_loopback_bind_is_warned_about_naming_the_address(tmp_path):
    result, _ = collect(tmp_path, "--metrics-host", "0.0.0.0", "--metrics-port", "0")
    assert result.returncode == 0
    (warning,) = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warning.startswith("kvtier collect: warning: /metrics listens on 0.0.0.0:")
    assert "reachable from other hosts" in warning
    loopback, _ = collect(tmp_path, "--metrics-port", "0")
    assert "warning" not in loopback.stderr
