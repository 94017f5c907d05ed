"""A tap that connects to its publisher (Dynamo's KV events, ``--vllm-connect``) says when it
has no working connection: pointed at nothing, at an HTTP port, or at a publisher that went
away, /healthz says "not connected" with the reason and the log says it once; ZMQ itself
retries in silence. Real ZMQ sockets and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

import pytest

from kvtier.collector.service import CollectorConfig, CollectorService
from kvtier.probes.vllm.tap import VllmEventTap, VllmTapConfig
from tests.conftest import free_port
from tests.probes.fake_http import FakeEngineHttp

pytestmark = pytest.mark.timeout(60)


def read_health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def collector(tmp_path, endpoint: str) -> CollectorService:
    config = VllmTapConfig(endpoints=(endpoint,), engine="dynamo", instance="n1",
                           connect_grace_s=1.0)
    return CollectorService(CollectorConfig(store_path=tmp_path / "s.duckdb", metrics_port=0),
                            [lambda on_batch: VllmEventTap(config, on_batch)]).start()


def health_until(service: CollectorService, done) -> tuple[int, dict]:
    deadline = time.monotonic() + 30  # bounds a broken tap, not a timing assertion
    status, body = read_health(service.metrics.health_url)
    while not done(body["taps"][0]) and time.monotonic() < deadline:
        time.sleep(0.1)
        status, body = read_health(service.metrics.health_url)
    return status, body


def test_a_tap_pointed_at_nothing_is_not_connected_and_says_so_once(tmp_path, caplog):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="kvtier.collector.peer_monitor"):
        service = collector(tmp_path, endpoint)
        try:
            status, body = health_until(service, lambda tap: tap["state"] != "running")
            time.sleep(0.5)  # ZMQ retries every 100 ms meanwhile: one log line all the same
        finally:
            service.stop()
    (tap,) = body["taps"]
    assert status == 503 and body["status"] == "failing" and tap["state"] == "not connected"
    assert tap["last_error"].startswith(f"never connected to {endpoint}: nothing accepts "
                                        "connections there")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"dynamo KV-event tap {tap['last_error']}"]


def test_a_tap_pointed_at_an_http_port_is_not_connected(tmp_path):
    http = FakeEngineHttp()
    endpoint = "tcp://127.0.0.1:" + http.url.rsplit(":", 1)[1]
    service = collector(tmp_path, endpoint)
    try:
        status, body = health_until(service, lambda tap: "handshake" in (tap["last_error"] or ""))
    finally:
        service.stop()
        http.close()
    (tap,) = body["taps"]
    assert status == 503 and tap["state"] == "not connected"
    assert tap["last_error"] == (f"never connected to {endpoint}: it answers, but not as a ZMQ "
                                 "publisher (the handshake failed: an HTTP port, or another "
                                 "protocol?)")


def test_a_publisher_that_answers_is_running_and_one_that_goes_away_is_not(tmp_path, caplog):
    import zmq

    publisher = zmq.Context.instance().socket(zmq.PUB)
    port = publisher.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    with caplog.at_level(logging.INFO, logger="kvtier.collector.peer_monitor"):
        service = collector(tmp_path, endpoint)
        try:
            deadline = time.monotonic() + 30
            while "connected to" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
            status, body = read_health(service.metrics.health_url)
            assert status == 200 and body["taps"][0]["state"] == "running"
            publisher.close(linger=0)  # the worker stops
            status, body = health_until(service, lambda tap: tap["state"] != "running")
        finally:
            service.stop()
            publisher.close(linger=0)
    assert status == 503
    assert body["taps"][0]["last_error"].startswith(f"lost its connection to {endpoint}: ")
    assert f"dynamo KV-event tap connected to {endpoint}" in caplog.text
