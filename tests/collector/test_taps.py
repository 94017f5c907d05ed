"""Tap supervision: fail fast at start, then log once, count, report on /healthz, back off, recover."""

from __future__ import annotations

import json
import logging
import socket
import urllib.error
import urllib.request

import pytest

from kvtier.collector.service import CollectorConfig, CollectorService, ServiceStartError
from kvtier.collector.store import TraceStore
from kvtier.collector.taps import Backoff, TapRunner
from kvtier.probes.trtllm.events import TrtllmEventPoller, TrtllmPollerConfig
from kvtier.probes.vllm.tap import VllmEventTap, VllmTapConfig
from tests.conftest import FixedClock
from tests.probes.fake_http import FakeEngineHttp

pytestmark = pytest.mark.timeout(60)


class FlakyTap:
    """A tap whose polls fail while ``down`` is set (a stand-in for an engine going away)."""

    name = "fake://engine"
    poll_every_s = 0.5

    def __init__(self):
        self.stats = type("Stats", (), {"bad_frames": 0})()
        self.down = False
        self.opens = self.closes = self.polls = 0

    def open(self):
        if self.down:
            raise OSError(111, "Connection refused")
        self.opens += 1

    def poll(self, timeout_s):
        self.polls += 1
        if self.down:
            raise OSError(111, "Connection refused")
        return 0

    def close(self):
        self.closes += 1


def test_backoff_doubles_to_its_cap():
    backoff = Backoff(initial_s=1, max_s=30)
    assert [backoff.delay_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    with pytest.raises(ValueError):
        Backoff(initial_s=0)


def test_a_failing_tap_is_logged_once_counted_backed_off_and_recovers(caplog):
    clock = FixedClock(100.0)
    tap = FlakyTap()
    runner = TapRunner(tap, backoff=Backoff(1, 8), clock=clock)
    runner.open()
    assert runner.step() == 0.5 and runner.health().up
    tap.down = True
    with caplog.at_level(logging.DEBUG, logger="kvtier.collector.taps"):
        waits = [runner.step() for _ in range(5)]
    assert waits == [1, 2, 4, 8, 8]  # the first failure closes the tap; reopening fails too
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "fake://engine failed" in warnings[0].getMessage()
    health = runner.health()
    assert (health.state, health.failures_total, health.up) == ("retrying", 5, False)
    assert health.last_error == "[Errno 111] Connection refused" and health.retry_in_s == 8
    assert tap.closes == 1  # closed once, when it broke; the failed reopens hold nothing
    tap.down = False
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvtier.collector.taps"):
        assert runner.step() == 0.5
    assert runner.health().up and runner.health().failures_total == 5
    assert ["works again after 5 failed attempt(s)" in r.getMessage() for r in caplog.records] == [True]


def test_start_fails_fast_on_a_busy_metrics_port_and_releases_the_store(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    path = tmp_path / "kvtier.duckdb"
    service = CollectorService(CollectorConfig(store_path=path, metrics_port=busy.getsockname()[1]))
    try:
        with pytest.raises(ServiceStartError) as failed:
            service.start()
    finally:
        busy.close()
    assert failed.value.part == "metrics" and failed.value.errno == 98
    with TraceStore(path) as again:  # the DuckDB lock was released
        assert again.count("requests") == 0


def test_start_fails_fast_on_a_busy_zmq_endpoint(tmp_path):
    holder = VllmEventTap(VllmTapConfig(endpoints=("tcp://127.0.0.1:0",), bind=True), print)
    (endpoint,) = holder.open()
    config = VllmTapConfig(endpoints=(endpoint,), bind=True)
    service = CollectorService(CollectorConfig(store_path=tmp_path / "s.duckdb", metrics_port=0),
                               [lambda on_batch: VllmEventTap(config, on_batch)])
    try:
        with pytest.raises(ServiceStartError) as failed:
            service.start()
    finally:
        holder.close()
    assert failed.value.part == endpoint and failed.value.errno == 98
    assert service.metrics is None  # the HTTP server it had bound is closed again


def read(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_tap_that_dies_later_shows_on_healthz_and_in_the_metrics(tmp_path):
    engine = FakeEngineHttp()
    engine.routes[("POST", "/kv_cache_events")] = [(200, b"[]")]
    url = engine.url + "/kv_cache_events"
    config = CollectorConfig(store_path=tmp_path / "s.duckdb", metrics_port=0, instance="n1")
    factory = lambda on_batch: TrtllmEventPoller(  # noqa: E731
        TrtllmPollerConfig(url=url, interval_s=0.05, timeout_s=1, instance="n1"), on_batch)
    service = CollectorService(config, [factory], backoff=Backoff(0.05, 0.2)).start()
    try:
        status, body = read(service.metrics.health_url)
        assert status == 200 and body["status"] == "ok" and body["taps"][0]["state"] == "running"
        engine.close()  # the engine goes away after the collector started
        for _ in range(100):
            status, body = read(service.metrics.health_url)
            if body["taps"][0]["failures_total"] >= 2:
                break
            import time
            time.sleep(0.05)
        assert status == 503 and body["status"] == "failing"
        tap = body["taps"][0]
        assert tap["name"] == url and tap["state"] == "retrying" and "Connection refused" in tap["last_error"]
        text = urllib.request.urlopen(service.metrics.url, timeout=5).read().decode()
        labels = f'endpoint="{url}",engine_instance="n1",tap="TrtllmEventPoller"'
        assert f"kvtier_tap_up{{{labels}}} 0.0" in text
        errors = float(text.split(f"kvtier_tap_errors_total{{{labels}}} ")[1].split()[0])
        assert errors >= 2
    finally:
        service.stop()
