"""The collector's end of the control channel: a ZMQ PUB socket that engines' connectors
subscribe to (every engine process, every data-parallel rank), and a heartbeat thread.

It binds (loopback by default: ``kvtier collect`` warns when told otherwise). Each instance's
state (``collector/control.py``: a whole state, signed with the shared token) is published
at once when it changes and again every ``heartbeat_s``: the repetition reaches an engine
that connected late and renews its lease. Publishing never waits: a subscriber too slow to
take a message loses it, and the next heartbeat carries the same state.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kvtier.collector.control import (
    DEFAULT_CONTROL_ENDPOINT,
    Command,
    LinkCosts,
    check_token,
    encode,
)

log = logging.getLogger(__name__)


class ControlSender:
    """One PUB socket and the states it repeats, by instance (see module doc)."""

    def __init__(self, token: bytes, endpoint: str = DEFAULT_CONTROL_ENDPOINT, *,
                 heartbeat_s: float = 1.0, clock: Callable[[], float] = time.time):
        if not heartbeat_s > 0:
            raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s!r}")
        self.token = check_token(token)
        self.endpoint, self.heartbeat_s = endpoint, heartbeat_s
        self._clock = clock
        self.epoch = int(clock() * 1000)
        self._sequence = 0
        self._states: dict[str, tuple[frozenset, bool, LinkCosts | None]] = {}
        self._lock = threading.Lock()  # the socket and the states
        self._wake = threading.Event()
        self._closed = False
        self._context = self._socket = self._thread = None
        self.bound: list[str] = []
        self.sent = 0

    def open(self) -> list[str]:
        """Bind the endpoint and start the heartbeat; ``OSError`` if it cannot bind. Returns
        the endpoints bound (the port chosen for ``:0``)."""
        import zmq

        self._context = zmq.Context()
        socket = self._context.socket(zmq.PUB)
        socket.setsockopt(zmq.SNDHWM, 1000)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.bind(self.endpoint)
        except zmq.ZMQError as error:
            socket.close()
            self._context.term()
            raise OSError(error.errno, f"cannot bind control endpoint {self.endpoint}: "
                                       f"{error.strerror}") from None
        self._socket = socket
        self.bound = [socket.getsockopt_string(zmq.LAST_ENDPOINT)]
        self._thread = threading.Thread(target=self._run, name="kvtier-control-heartbeat",
                                        daemon=True)
        self._thread.start()
        return self.bound

    def set_state(self, instance: str, paused=frozenset(), act: bool = False,
                  costs: LinkCosts | None = None) -> Command:
        """Publish ``instance``'s state now and on every heartbeat from now on."""
        with self._lock:
            self._states[instance] = (frozenset(paused), act, costs)
            return self._publish(instance)

    def states(self) -> dict[str, tuple[frozenset, bool, LinkCosts | None]]:
        with self._lock:
            return dict(self._states)

    def _publish(self, instance: str) -> Command:
        paused, act, costs = self._states[instance]
        self._sequence += 1
        command = Command(instance, self.epoch, self._sequence, self._clock(), paused, act, costs)
        if self._socket is not None:
            import zmq

            try:
                self._socket.send_multipart(encode(command, self.token), flags=zmq.NOBLOCK)
                self.sent += 1
            except zmq.ZMQError as error:  # never stop the heartbeat: the next one retries
                log.debug("control: a state for %s was not sent: %s", instance, error)
        return command

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.heartbeat_s)
            if self._closed:
                return
            with self._lock:
                for instance in list(self._states):
                    self._publish(instance)

    def close(self) -> None:
        """Stop the heartbeat and close the socket (the engines' leases then run out)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            if self._socket is not None:
                self._socket.close(linger=0)
                self._context.term()
            self._socket = None
