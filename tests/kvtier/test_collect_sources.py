"""`kvtier collect` and sources it cannot use: flags that cannot work stop it at start (exit
2, one line); a tap pointed at nothing says so on /healthz and in its log; a scrape that
trickles in does not hold a SIGTERM. Real servers on 127.0.0.1, the collector as a process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import free_port
from tests.kvtier.test_bad_inputs import make_immutable
from tests.probes.fake_http import TricklingHttp

pytestmark = pytest.mark.timeout(90)


def collect(*flags) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvtier", "collect", "--metrics-port", "0",
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def started(service: subprocess.Popen, taps: int) -> str:
    """Read the start lines up to the last tap's; returns the health URL."""
    health = None
    for line in service.stdout:
        if "health at" in line:
            health = line.split("health at ", 1)[1].strip()
        taps -= "kvtier collect: tap " in line
        if not taps:
            return health
    raise AssertionError(f"the collector did not start: {service.communicate()}")


@pytest.mark.parametrize("flags, says", [
    (["--scrape-interval-s", "1e-9"], "--scrape-interval-s must be at least 0.1 s"),
    (["--scrape", "http://127.0.0.1:8000/metrics=vlm"],
     "--scrape 'http://127.0.0.1:8000/metrics=vlm': unknown profile 'vlm'; known: vllm, "
     "lmcache, sglang, dynamo, trtllm"),
    (["--scrape", "http://"], "--scrape 'http://': url 'http://' names no host"),
])
def test_flags_that_cannot_work_exit_2_at_start(tmp_path, flags, says):
    done = subprocess.run([sys.executable, "-m", "kvtier", "collect", "--store",
                           str(tmp_path / "s.duckdb"), "--metrics-port", "0", "--duration-s", "1",
                           *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"kvtier collect: error: {says}")
    assert not (tmp_path / "s.duckdb").exists()


def test_a_read_only_segment_folder_is_refused_at_start(tmp_path):
    segments = tmp_path / "segments"
    segments.mkdir()
    undo = make_immutable(segments)
    try:
        done = subprocess.run([sys.executable, "-m", "kvtier", "collect", "--store",
                               str(tmp_path / "s.duckdb"), "--segments", str(segments),
                               "--metrics-port", "0", "--duration-s", "1"],
                              capture_output=True, text=True, timeout=60)
    finally:
        undo()
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"kvtier collect: error: --segments {segments}: cannot write there (")


def test_dynamo_events_pointed_at_nothing_fail_on_healthz_and_in_the_log(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    service = collect("--store", str(tmp_path / "s.duckdb"), "--dynamo-events", endpoint)
    try:
        health_url = started(service, 1)
        deadline = time.monotonic() + 30  # bounds a broken tap, not a timing assertion
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(health_url, timeout=5)
            except urllib.error.HTTPError as error:
                status, body = error.code, json.loads(error.read())
                break
            time.sleep(0.1)
        service.send_signal(signal.SIGTERM)
        _, err = service.communicate(timeout=60)
    finally:
        service.kill() if service.poll() is None else None
    assert service.returncode == 0
    (tap,) = body["taps"]
    assert status == 503 and tap["state"] == "not connected"
    assert tap["last_error"].startswith(f"never connected to {endpoint}: nothing accepts")
    assert f"dynamo KV-event tap never connected to {endpoint}" in err


def test_sigterm_ends_a_collector_whose_scrape_trickles_in(tmp_path):
    """The page sends a byte every 0.3 s, so no socket read ever times out: the stop must not
    wait for the scrape (it waited 35 s: the stop's 30 s grace and 5 s more)."""
    server = TricklingHttp(every_s=0.3)
    service = collect("--store", str(tmp_path / "s.duckdb"), "--scrape",
                      server.url + "/metrics=vllm", "--scrape-interval-s", "1")
    try:
        started(service, 1)
        while not server.connections:
            time.sleep(0.05)
        asked = time.monotonic()
        service.send_signal(signal.SIGTERM)
        out, _ = service.communicate(timeout=60)
        took_s = time.monotonic() - asked
    finally:
        service.kill() if service.poll() is None else None
        server.close()
    assert service.returncode == 0 and "stopped; the store holds" in out
    assert took_s < 15  # the regression took 35 s; a stop here takes one or two
