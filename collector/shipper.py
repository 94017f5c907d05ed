"""The engine-side shipper: one daemon thread per engine process drains every recorder in it
and PUSHes each batch to the collector (``kvtier collect --hooks``, a PULL socket).

Runs inside the engine's process, so it imports only the standard library, numpy and pyzmq,
and it never makes the engine wait: hooks append to their recorder's buffer and return; this
thread drains every ``interval_s`` and sends with ``NOBLOCK`` on a PUSH socket that queues only
for a connected collector (``ZMQ_IMMEDIATE``), at most ``queue_batches`` batches. A batch that
cannot be sent now (no collector, or its queue full) is dropped and counted, and the count
travels in the header of every later batch (``collector/shipment.py``), so the collector's
``kvtier_recorder_dropped_events_total`` says what was lost. Batches in flight when a
collector dies are lost without the engine knowing; the next batch's ``first_event`` tells the
collector how many events it missed.

Shutdown flushes what is buffered, waiting at most ``flush_timeout_s`` for a collector:
:meth:`Shipper.close` (the vLLM plug-ins call :func:`flush_all` from their ``shutdown``) and
at interpreter exit. :func:`wake_on_sigterm` makes a SIGTERM start a drain at once, before
the engine's own handler runs.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kvtier.collector.shipment import Shipment, encode

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5570"
ENDPOINT_VARIABLE = "KVTIER_COLLECTOR"


@dataclass(frozen=True)
class ShipperConfig:
    """Where and how often to ship. ``queue_batches``: batches ZMQ may hold for a slow
    collector before new ones are dropped; ``flush_timeout_s`` bounds every flush."""

    endpoint: str = DEFAULT_ENDPOINT
    interval_s: float = 0.25
    queue_batches: int = 64
    flush_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.endpoint, str) or "://" not in self.endpoint:
            raise ValueError(f"endpoint must be a ZMQ endpoint such as {DEFAULT_ENDPOINT}, "
                             f"got {self.endpoint!r}")
        for name in ("interval_s", "flush_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.queue_batches < 1:
            raise ValueError(f"queue_batches must be >= 1, got {self.queue_batches!r}")


def endpoint_from(configured: str | None) -> str:
    """The collector endpoint: the configured one, else ``$KVTIER_COLLECTOR``, else the
    loopback default."""
    return configured or os.environ.get(ENDPOINT_VARIABLE) or DEFAULT_ENDPOINT


class _Stream:
    """One recorder's position in its stream and its cumulative drops."""

    __slots__ = ("recorder", "sequence", "sent_events", "dropped_events", "dropped_requests",
                 "dropped_steps")

    def __init__(self, recorder) -> None:
        self.recorder = recorder
        self.sequence = self.sent_events = self.dropped_events = self.dropped_requests = 0
        self.dropped_steps = 0


class Shipper:
    """Drains its recorders on one daemon thread and sends their batches (see module doc)."""

    def __init__(self, config: ShipperConfig = ShipperConfig(), *,
                 clock: Callable[[], float] = time.time) -> None:
        import zmq

        self.config = config
        self._clock = clock
        self._zmq = zmq
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        self._socket.setsockopt(zmq.SNDHWM, config.queue_batches)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(config.endpoint)
        self._streams: list[_Stream] = []
        self._lock = threading.Lock()  # streams and the socket (ZMQ sockets are not thread-safe)
        self._wake = threading.Event()
        self._closed = False
        self.pid = os.getpid()
        self.batches_sent = self.batches_dropped = 0
        self._thread = threading.Thread(target=self._run, name="kvtier-shipper", daemon=True)
        self._thread.start()

    def add(self, recorder) -> None:
        """Ship ``recorder``'s batches from now on."""
        with self._lock:
            if all(s.recorder is not recorder for s in self._streams):
                self._streams.append(_Stream(recorder))

    def wake(self) -> None:
        """Drain now instead of at the next interval (safe in a signal handler)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.config.interval_s)
            self._wake.clear()
            if self._closed:
                return
            try:
                self.ship_pending()
            except Exception:  # never let the thread die: the engine keeps recording
                log.exception("kvtier shipper: drain failed")

    def ship_pending(self, deadline: float | None = None) -> int:
        """Drain every recorder and send; returns batches sent. Without ``deadline`` (a
        ``time.monotonic()`` value) a batch that cannot go out at once is dropped; with it,
        sending is retried until then."""
        sent = 0
        with self._lock:
            if self._socket.closed:
                return 0
            for stream in self._streams:
                while (packed := stream.recorder.take_packed()) is not None:
                    sent += self._send(stream, packed, deadline)
        return sent

    def _send(self, stream: _Stream, packed, deadline: float | None) -> int:
        recorder = stream.recorder
        try:
            frames = encode(Shipment(
                packed, stream.sequence, stream.sent_events,
                dropped_events_total=stream.dropped_events + recorder.dropped_events,
                dropped_requests_total=stream.dropped_requests + recorder.dropped_requests,
                sent_s=self._clock(),
                dropped_steps_total=stream.dropped_steps + recorder.dropped_steps))
        except ValueError:
            log.exception("kvtier shipper: batch of %s could not be encoded", packed.origin.source)
            return self._dropped(stream, packed)
        while True:
            try:
                self._socket.send_multipart(frames, flags=self._zmq.NOBLOCK, copy=False)
            except self._zmq.Again:
                if deadline is not None and time.monotonic() < deadline:
                    time.sleep(0.005)
                    continue
                return self._dropped(stream, packed)
            stream.sequence += 1
            stream.sent_events += packed.num_events
            self.batches_sent += 1
            return 1

    def _dropped(self, stream: _Stream, packed) -> int:
        stream.dropped_events += packed.num_events
        stream.dropped_requests += len(packed.requests)
        stream.dropped_steps += len(packed.steps)
        self.batches_dropped += 1
        return 0

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the thread, ship what is buffered (waiting at most ``timeout_s``, default
        ``flush_timeout_s``, for a collector), close the socket. Idempotent."""
        if self._closed:
            return
        deadline = time.monotonic() + (self.config.flush_timeout_s if timeout_s is None else timeout_s)
        self._closed = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        try:
            self.ship_pending(deadline)
        finally:
            with self._lock:
                linger_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
                self._socket.setsockopt(self._zmq.LINGER, linger_ms)
                self._socket.close()
            self._context.term()


_SHIPPERS: dict[str, Shipper] = {}
_SHIPPERS_LOCK = threading.Lock()


def ship(recorder, config: ShipperConfig) -> Shipper:
    """Ship ``recorder`` with this process's shipper for ``config.endpoint`` (started on first
    use; a forked child starts its own)."""
    with _SHIPPERS_LOCK:
        shipper = _SHIPPERS.get(config.endpoint)
        if shipper is None or shipper.pid != os.getpid():
            shipper = _SHIPPERS[config.endpoint] = Shipper(config)
            if len(_SHIPPERS) == 1:
                atexit.register(flush_all)
        shipper.add(recorder)
        return shipper


def flush_all(timeout_s: float | None = None) -> None:
    """Close every shipper of this process, each flush bounded (see :meth:`Shipper.close`)."""
    with _SHIPPERS_LOCK:
        shippers = [s for s in _SHIPPERS.values() if s.pid == os.getpid()]
    for shipper in shippers:
        try:
            shipper.close(timeout_s)
        except Exception:
            log.exception("kvtier shipper: flush to %s failed", shipper.config.endpoint)


def wake_on_sigterm() -> bool:
    """Chain a SIGTERM handler that starts a drain, then calls the handler already installed
    (an engine's own shutdown). Only when called in the main thread and that handler is a
    Python function: kvtier never changes what SIGTERM does to a process. Returns whether it
    chained."""
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous) or getattr(previous, "_kvtier_wakes", False):
        return False

    def handler(signum, frame):
        for shipper in list(_SHIPPERS.values()):
            shipper.wake()
        return previous(signum, frame)

    handler._kvtier_wakes = True
    signal.signal(signal.SIGTERM, handler)
    return True
