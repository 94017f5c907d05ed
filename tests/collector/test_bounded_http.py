"""Every HTTP server kvtier runs is bounded the same way (``collector/bounded_http.py``): one
contract, run against each real server (the collector's ``/metrics`` and ``/healthz``, the
reference engine's API) through real sockets.

* A burst of clients at once is answered in full, none reset or left waiting: below the cap
  each gets its page, past it a 503.
* Past the cap, a connection is answered 503 with ``Retry-After`` at once and counted on
  the server's ``/metrics`` (``kvtier_http_overloaded_connections_total``).
* Idle connections hold at most the cap of threads; one idle past ``idle_timeout_s`` is
  closed, which frees its slot.

The assertions are on statuses and counts. Waits are bounded by generous deadlines that only
a broken server reaches (a loaded 2-core host answers these in well under a second).
"""

from __future__ import annotations

import re
import resource
import select
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from kvtier.collector.exports.http import LIMITS
from kvtier.collector.service import CollectorConfig, CollectorService
from kvtier.refengine.server import EngineServer, ServerSettings
from tests.refengine.conftest import tiny_config

pytestmark = pytest.mark.timeout(300)
WAIT_S = 60.0  # what a client waits for an answer: only a broken server makes it wait so long


@dataclass(frozen=True)
class Served:
    """A running server: where it listens, its health page, and its cap."""

    host: str
    port: int
    health_path: str
    max_connections: int


@pytest.fixture(autouse=True)
def enough_files():
    """Room for a few hundred sockets at both ends (a soft limit of 1024 is common)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(params=["collector", "engine"])
def server(request, tmp_path):
    wait_until(lambda: connection_threads() == 0, "the connections of earlier tests ended")
    if request.param == "collector":
        service = CollectorService(CollectorConfig(store_path=tmp_path / "c.duckdb",
                                                   metrics_port=0)).start()
        try:
            yield Served(service.metrics.host, service.metrics.port, "/healthz",
                         LIMITS.max_connections)
        finally:
            service.stop()
    else:
        engine = EngineServer(tiny_config(tmp_path), ServerSettings(port=0)).start()
        try:
            host, port = engine._http.server_address[:2]
            yield Served(host, port, "/health", engine.settings.max_connections)
        finally:
            engine.stop()


def get(served: Served, path: str) -> tuple[int | str, dict[str, str], bytes]:
    """One request on its own connection: (status or the exception's name, headers, body)."""
    try:
        with socket.create_connection((served.host, served.port), timeout=WAIT_S) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return parse(read_all(sock))
    except OSError as error:
        return type(error).__name__, {}, b""


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def parse(data: bytes) -> tuple[int | str, dict[str, str], bytes]:
    if not data:
        return "closed without an answer", {}, b""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in headers.items()}, body


def burst(served: Served, clients: int) -> Counter:
    """``clients`` requests for the health page, all started together; their statuses."""
    answers: list = []
    ready = threading.Barrier(clients)

    def one() -> None:
        ready.wait()
        answers.append(get(served, served.health_path)[0])

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return Counter(answers)


def overloaded_total(served: Served) -> float:
    status, _, body = get(served, "/metrics")
    assert status == 200, status
    return float(re.search(rb"^kvtier_http_overloaded_connections_total (\S+)$", body, re.M).group(1))


def connection_threads() -> int:
    """Threads serving a connection in this process (socketserver names them so)."""
    return sum("process_request_thread" in thread.name for thread in threading.enumerate())


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {WAIT_S} s"
        time.sleep(0.05)


def idle_connections(served: Served, count: int) -> list[socket.socket]:
    return [socket.create_connection((served.host, served.port), timeout=WAIT_S) for _ in range(count)]


def test_a_burst_of_clients_is_answered_in_full(server):
    assert burst(server, 50) == Counter({200: 50})  # below the cap: every one served
    answered = burst(server, 300)
    assert set(answered) <= {200, 503} and sum(answered.values()) == 300, answered
    assert overloaded_total(server) == answered[503]  # a fresh server: these are all


def test_past_the_cap_a_connection_is_answered_503_at_once_and_counted(server):
    held = idle_connections(server, server.max_connections)
    try:
        wait_until(lambda: connection_threads() == server.max_connections, "every slot held")
        assert burst(server, 300) == Counter({503: 300})
        status, headers, body = get(server, server.health_path)
        assert (status, headers["retry-after"]) == (503, "1")
        assert f"maximum of {server.max_connections}" in body.decode() or \
            f"at most {server.max_connections}" in body.decode()
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: get(server, server.health_path)[0] == 200, "served again once they left")
    assert overloaded_total(server) == 301


def test_idle_connections_hold_at_most_the_cap_of_threads(server):
    extra = 200
    idle = idle_connections(server, server.max_connections + extra)
    try:
        def answered() -> list[socket.socket]:
            readable, _, _ = select.select(idle, [], [], 0)
            return readable

        wait_until(lambda: len(answered()) >= extra, f"{extra} connections past the cap answered")
        statuses = Counter(parse(read_all(sock))[0] for sock in answered())
        assert statuses[503] == extra, statuses
        assert connection_threads() <= server.max_connections
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: connection_threads() == 0, "every connection thread ended")


def test_a_connection_idle_past_its_timeout_is_closed_and_frees_its_slot(tmp_path):
    engine = EngineServer(tiny_config(tmp_path), ServerSettings(port=0, max_connections=2,
                                                                idle_timeout_s=0.5)).start()
    try:
        host, port = engine._http.server_address[:2]
        served = Served(host, port, "/health", 2)
        held = idle_connections(served, 2)
        try:
            for sock in held:  # the server closes each: an end of file, no answer
                assert sock.recv(1) == b""
            wait_until(lambda: get(served, "/health")[0] == 200, "a slot free again")
        finally:
            for sock in held:
                sock.close()
    finally:
        engine.stop()
