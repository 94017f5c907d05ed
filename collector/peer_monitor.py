"""Connections a bound ZMQ socket lost, seen through ZMQ's socket monitor.

ZMQ cuts off a sender whose frame is above the socket's ``MAXMSGSIZE`` without handing the
receiver anything: the frame never arrives and nothing raises. The monitor's
``EVENT_DISCONNECTED`` is the one trace it leaves, so a tap counts and logs every
disconnect (an engine that stopped closes its connection the same way; the log says both).
"""

from __future__ import annotations

import logging

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
