"""What ZMQ does to a tap's connections without a word, seen through its socket monitor.

A bound socket (:class:`PeerMonitor`): ZMQ cuts off a sender whose frame is above the
socket's ``MAXMSGSIZE`` without handing the receiver anything: the frame never arrives and
nothing raises. The monitor's ``EVENT_DISCONNECTED`` is the one trace it leaves, so a tap
counts and logs every disconnect (an engine that stopped closes its connection the same way;
the log says both).

A socket that connects (:class:`ConnectionMonitor`): ZMQ retries a refused connect forever
and drops a peer that does not speak ZMQ, so a tap pointed at nothing, or at an HTTP port,
would look as healthy as one that receives; the monitor tells them apart.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)


class PeerMonitor:
    """Counts the disconnects of one socket's peers; :meth:`read` takes the pending events
    without waiting. ``what`` names the socket in the log line; ``limit_bytes`` is its
    ``MAXMSGSIZE``."""

    def __init__(self, socket, what: str, limit_bytes: int):
        import zmq

        self._zmq = zmq
        self._what, self._limit_bytes = what, limit_bytes
        self._socket = socket
        self.events = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.disconnects_total = 0

    def read(self) -> int:
        """Count the disconnects that arrived; returns how many."""
        from zmq.utils.monitor import recv_monitor_message

        seen = 0
        while True:
            try:
                event = recv_monitor_message(self.events, self._zmq.NOBLOCK)
            except self._zmq.Again:
                return seen
            if event["event"] == self._zmq.EVENT_DISCONNECTED:
                seen += 1
                self.disconnects_total += 1
                log.warning("%s: a sender's connection closed (%s): an engine that stopped, or "
                            "a message above %d bytes, which ZMQ cuts off unseen; %d so far",
                            self._what, event["endpoint"].decode(errors="replace"),
                            self._limit_bytes, self.disconnects_total)

    def close(self) -> None:
        try:
            self._socket.disable_monitor()
        except self._zmq.ZMQError:  # the socket is already closed
            pass
        self.events.close(linger=0)


@dataclass
class _Link:
    """One endpoint a socket connects to."""

    since_s: float
    up: bool = False
    ever_up: bool = False
    reason: str | None = None
    logged: str | None = ""  # the problem last logged (None: connected); "" before the first


_REFUSED = "nothing accepts connections there (refused or unreachable); ZMQ keeps retrying"
_NOT_ZMQ = ("it answers, but not as a ZMQ publisher (the handshake failed: an HTTP port, or "
            "another protocol?)")
_CLOSED = "the connection closed (the publisher stopped?); ZMQ keeps retrying"


class ConnectionMonitor:
    """Whether a socket that connects has a working connection to each of its endpoints, seen
    through ZMQ's socket monitor: ZMQ retries a refused connect, and drops a peer that does not
    speak ZMQ (an HTTP port) after its handshake interval, without a word to the socket's user.

    :meth:`read` takes the pending events without waiting and logs each endpoint's change
    once (a problem as a warning, a connection as info); :meth:`problem` says what is wrong, or
    ``None`` while every endpoint is connected. A connect that stays silent for ``grace_s``
    counts as failed (it is the socket's handshake interval too). Create it before the socket
    connects, so it sees the first attempt."""

    def __init__(self, socket, endpoints: tuple[str, ...], what: str, grace_s: float,
                 clock: Callable[[], float] = time.monotonic):
        import zmq

        self._zmq, self._what, self._grace_s, self._clock = zmq, what, grace_s, clock
        self._socket = socket
        socket.setsockopt(zmq.HANDSHAKE_IVL, int(grace_s * 1000))  # a silent peer is dropped
        mask = 0
        for name in ("EVENT_CONNECTED", "EVENT_CLOSED", "EVENT_DISCONNECTED",
                     "EVENT_HANDSHAKE_SUCCEEDED", "EVENT_HANDSHAKE_FAILED_NO_DETAIL",
                     "EVENT_HANDSHAKE_FAILED_PROTOCOL", "EVENT_HANDSHAKE_FAILED_AUTH"):
            mask |= getattr(zmq, name)
        self.events = socket.get_monitor_socket(mask)
        self._lock = threading.Lock()
        self._links = {endpoint: _Link(clock()) for endpoint in endpoints}

    def read(self) -> None:
        """Take the events that arrived; log what changed."""
        from zmq.utils.monitor import recv_monitor_message

        zmq = self._zmq
        while True:
            try:
                event = recv_monitor_message(self.events, zmq.NOBLOCK)
            except zmq.Again:
                break
            endpoint = event["endpoint"].decode(errors="replace")
            with self._lock:
                link = self._links.setdefault(endpoint, _Link(self._clock()))
                self._apply(link, event["event"])
        for endpoint, problem in self._problems():
            if problem is not None or self._links[endpoint].up:  # not while a connect is pending
                self._log(endpoint, problem)

    def _apply(self, link: _Link, event: int) -> None:
        zmq = self._zmq
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            link.up, link.ever_up, link.reason = True, True, None
        elif event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                       zmq.EVENT_HANDSHAKE_FAILED_AUTH):
            link.up, link.reason = False, _NOT_ZMQ
        elif event == zmq.EVENT_CLOSED and not link.up:  # a connect attempt failed
            link.reason = _REFUSED
        elif event == zmq.EVENT_DISCONNECTED and link.up:
            link.up, link.reason, link.since_s = False, _CLOSED, self._clock()

    def _problems(self) -> list[tuple[str, str | None]]:
        now = self._clock()
        with self._lock:
            return [(endpoint, self._problem(endpoint, link, now))
                    for endpoint, link in self._links.items()]

    def _problem(self, endpoint: str, link: _Link, now: float) -> str | None:
        if link.up:
            return None
        reason = link.reason
        if reason is None and now - link.since_s >= self._grace_s:
            reason = f"no ZMQ publisher answered within {self._grace_s:g} s"
        if reason is None:
            return None
        return f"{'lost its connection to' if link.ever_up else 'never connected to'} {endpoint}: {reason}"

    def _log(self, endpoint: str, problem: str | None) -> None:
        with self._lock:
            link = self._links[endpoint]
            if problem == link.logged:
                return
            before, link.logged = link.logged, problem
        if problem is not None:
            log.warning("%s %s", self._what, problem)
        elif before:  # after a problem that was logged
            log.warning("%s connected to %s", self._what, endpoint)
        else:
            log.info("%s connected to %s", self._what, endpoint)

    def problem(self) -> str | None:
        """What is wrong with the connections (one line), or ``None`` while all work."""
        problems = [p for _, p in self._problems() if p is not None]
        return "; ".join(problems) if problems else None

    def close(self) -> None:
        try:
            self._socket.disable_monitor()
        except self._zmq.ZMQError:  # the socket is already closed
            pass
        self.events.close(linger=0)
