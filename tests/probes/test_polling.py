"""The bounded GET/POST every poller and scraper uses: a whole request ends at its deadline
(connect, headers and body together), however slowly a server trickles; a stop ends it at
once; a body shorter than its Content-Length is an error. Real loopback HTTP servers."""

from __future__ import annotations

import threading

import pytest

from kvtier.collector.taps import TapRunner
from kvtier.probes.polling import Deadline, FetchError, fetch
from kvtier.probes.scrape.metrics_tap import ScrapeTap, ScrapeTapConfig
from tests.probes.fake_http import FakeEngineHttp, TricklingHttp

pytestmark = pytest.mark.timeout(30)  # before the deadline, a trickle held a fetch forever


@pytest.mark.parametrize("headers", [False, True], ids=["body", "headers"])
def test_a_server_that_trickles_a_byte_at_a_time_is_cut_at_the_deadline(headers):
    server = TricklingHttp(every_s=0.3, headers=headers)  # each read waits well under 1 s
    try:
        with pytest.raises(FetchError, match=r"no complete answer within 1 s \(connect, "
                                             r"headers and body together\)"):
            fetch(server.url + "/metrics", timeout_s=1.0)
    finally:
        server.close()


def test_a_stop_ends_a_request_in_flight_at_once():
    server = TricklingHttp(every_s=0.3)
    deadline, failures = Deadline(600.0), []

    def scrape():
        try:
            fetch(server.url + "/metrics", timeout_s=600.0, deadline=deadline)
        except FetchError as error:
            failures.append(str(error))

    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        while not server.connections:
            thread.join(0.05)
        deadline.interrupt()
        thread.join(20)  # far below the 600 s deadline
        assert not thread.is_alive()
    finally:
        server.close()
    assert failures and failures[0].endswith("stopped before it finished")


def test_a_body_shorter_than_its_content_length_is_an_error():
    server = FakeEngineHttp()
    server.routes[("GET", "/metrics")] = [(200, b"vllm:x 1\n", 500)]
    try:
        with pytest.raises(FetchError, match="the body ended after 9 of the 500 bytes its "
                                             "Content-Length promised"):
            fetch(server.url + "/metrics")
        server.routes[("GET", "/metrics")] = [(200, b"vllm:x 1\n")]
        assert fetch(server.url + "/metrics") == b"vllm:x 1\n"
    finally:
        server.close()


def test_a_trickled_scrape_is_a_failed_scrape_of_the_tap():
    server = TricklingHttp(every_s=0.3)
    runner = TapRunner(ScrapeTap(ScrapeTapConfig(server.url + "/metrics", "vllm", timeout_s=1.0),
                                 lambda batch: None))
    try:
        runner.step()
    finally:
        server.close()
    health = runner.health()
    assert health.state == "retrying" and health.failures_total == 1
    assert "no complete answer within 1 s" in health.last_error


def test_a_collector_stop_ends_a_scrape_in_flight(tmp_path, caplog):
    """The stop interrupts the scrape, not waits for its deadline (here 600 s): the tap's
    thread finishes within the stop, which otherwise gives up on it after its grace."""
    import logging

    from kvtier.collector.service import CollectorConfig, CollectorService

    server = TricklingHttp(every_s=0.3)
    config = CollectorConfig(store_path=tmp_path / "s.duckdb", metrics_port=None, stop_grace_s=0)
    service = CollectorService(config, [lambda on_batch: ScrapeTap(
        ScrapeTapConfig(server.url + "/metrics", "vllm", timeout_s=600.0), on_batch)]).start()
    try:
        while not server.connections:
            threading.Event().wait(0.05)
    finally:
        with caplog.at_level(logging.WARNING, logger="kvtier.collector.taps"):
            service.stop()
        server.close()
    assert "did not finish" not in caplog.text
