"""The bounds every HTTP server kvtier runs shares (the collector's ``/metrics`` and
``/healthz``, the reference engine's API): one mechanism, built into each server class with
:class:`BoundedServerMixin`.

Python's standard servers listen with a backlog of 5 and start a thread per connection with
no cap: past 5 connections at once, new ones wait on SYN retransmits (seconds each) or are
reset, and a client that connects and sends nothing holds a thread forever. A bounded
server, per its :class:`ConnectionLimits`:

* listens with a backlog of ``listen_backlog``: a burst of that many new connections waits in
  the kernel until the server takes it, none is reset;
* serves at most ``max_connections`` connections at once, a thread each; one past that is
  answered at once, from the accepting thread, with ``503 Service Unavailable`` and
  ``Retry-After``, then closed; counted (``kvtier_http_overloaded_connections_total`` on
  the server's ``/metrics``, :class:`ServerMetrics`) and logged (the 1st, 10th, 100th, ...);
* closes a connection that sends or reads nothing for ``idle_timeout_s``, which frees its
  thread and its slot.

A connection that fails (the client hung up or went quiet) is logged at debug level, never
as a traceback on stderr.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from dataclasses import dataclass
from socketserver import ThreadingMixIn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    """How much a server takes at once (see the module): ``max_connections`` connections are
    served at once, and a connection idle for ``idle_timeout_s`` is closed."""

    max_connections: int
    idle_timeout_s: float

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {self.idle_timeout_s!r}")

    @property
    def listen_backlog(self) -> int:
        """New connections the kernel holds until the server takes them: a whole cap's worth
        at least (a burst of ``max_connections`` clients waits, none is reset), and no fewer
        than 1024, for a burst that outpaces the accepting thread (the kernel caps it at
        ``net.core.somaxconn``)."""
        return max(self.max_connections, 1024)


class BoundedServerMixin(ThreadingMixIn):
    """Put first in a ``socketserver`` server's bases (``class S(BoundedServerMixin,
    HTTPServer)``) and build it with ``limits=``; :meth:`overload_body` says what a refused
    connection reads (JSON by default). ``overloaded_total`` and ``connections`` are read
    by :class:`ServerMetrics`."""

    daemon_threads = True

    def __init__(self, address, handler, *, limits: ConnectionLimits, **kwargs):
        self.limits = limits
        self.request_queue_size = limits.listen_backlog  # listen() reads it in server_activate
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._counts = threading.Lock()
        self.overloaded_total = 0
        self.connections = 0
        super().__init__(address, handler, **kwargs)

    def overload_body(self) -> tuple[bytes, str]:
        """The body of a 503 and its content type."""
        message = (f"the server already serves its maximum of {self.limits.max_connections} "
                   "connections; retry later")
        return json.dumps({"error": message}).encode(), "application/json"

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request, client_address)
            return
        with self._counts:
            self.connections += 1
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self._release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            request.settimeout(self.limits.idle_timeout_s)
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def handle_error(self, request, client_address) -> None:
        """One debug line, no traceback: a failed connection is the client's business."""
        log.debug("connection from %s failed: %s", client_address, sys.exc_info()[1])

    def _release(self) -> None:
        with self._counts:
            self.connections -= 1
        self._slots.release()

    def _refuse(self, request, client_address) -> None:
        """Answer 503 and close, without ever waiting on the client (this is the accepting
        thread). What the client already sent is read first: a socket closed over unread
        bytes sends a reset, which would lose the answer."""
        with self._counts:
            self.overloaded_total += 1
            count = self.overloaded_total
        if _is_power_of_ten(count):
            log.warning("HTTP server on %s serves its maximum of %d connections; new ones are "
                        "answered 503 (%d so far, kvtier_http_overloaded_connections_total)",
                        _address(self.server_address), self.limits.max_connections, count)
        body, content_type = self.overload_body()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
        try:
            request.setblocking(False)
            _discard_received(request)
            request.send(head.encode() + body)
            request.shutdown(socket.SHUT_WR)
            _discard_received(request)
        except OSError as error:
            log.debug("refusing %s: %s", client_address, error)
        finally:
            request.close()


class ServerMetrics:
    """A ``prometheus_client`` collector of a bounded server's counts: register it on the
    registry its ``/metrics`` serves."""

    def __init__(self, server: BoundedServerMixin):
        self._server = server

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        server = self._server
        yield CounterMetricFamily(
            "kvtier_http_overloaded_connections", "Connections answered 503 at once because "
            f"the server already served its maximum of {server.limits.max_connections}",
            value=server.overloaded_total)
        yield GaugeMetricFamily("kvtier_http_connections", "Connections being served now",
                                value=server.connections)


def _discard_received(sock: socket.socket) -> None:
    """Read and drop what already arrived on a non-blocking socket (at most 64 KiB)."""
    for _ in range(16):
        try:
            if not sock.recv(4096):
                return
        except (BlockingIOError, InterruptedError):
            return


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1


def _address(address) -> str:
    return f"{address[0]}:{address[1]}"
