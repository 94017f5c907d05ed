"""Event taps as the collector service drives them: the protocol, and one supervisor per tap.

A tap reads what an engine publishes (vLLM's ZMQ KV events, TensorRT-LLM's
``/kv_cache_events``, the in-engine recorders' shipper) and hands batches to a callback. The
service owns the threads, so every tap gets the same treatment:

* ``open()`` binds or connects before the service says it is running; a failure there
  (address in use, an address this host does not have) stops the service's start at once;
* afterwards a failure inside ``poll()`` is logged once, counted, shown by :class:`TapHealth`
  (``/healthz`` and ``kvtier_tap_up``), and polled again with exponential backoff until it
  works again, when that is logged once too. Only a failure of the source (an ``OSError``:
  a broken socket, an engine that does not answer) closes the tap and reopens it; anything
  else (a store that cannot be read, a fault in the tap's own code) leaves its socket open,
  since closing it would lose what already waits there.

Data problems (a bad frame, a malformed event) are not failures: taps skip and count them in
their ``stats`` and keep running.

On stop, what already reached a tap is not lost: the tap's own thread stops polling, lets the
tap hand over what is queued (``drain``, bounded by the grace the service gives it) and then
closes it, so a socket is never closed under a thread that still reads it. What the tap could
not take within the grace is counted (:attr:`TapRunner.unread_batches`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from kvtier.collector.batch import EventBatch

log = logging.getLogger(__name__)


class Tap(Protocol):
    """A source of event batches, driven by :class:`TapRunner`.

    ``name`` says what the tap reads (endpoint or URL) for logs, health and metric labels.
    ``open()`` creates and binds/connects its sockets (idempotent); it raises ``OSError`` when
    the address cannot be used and ``ValueError`` when it is malformed. ``poll(timeout_s)``
    hands over what arrived, waiting at most ``timeout_s``, and returns how many batches it
    delivered; it raises ``OSError`` when the source is unreachable or broken. ``close()``
    releases the sockets (idempotent). ``poll_every_s`` is the pause between polls (``0``
    for taps whose ``poll`` itself waits). ``stats`` holds the tap's counters (``bad_frames``,
    ``gaps``, ...), which the service exports.

    A tap that holds received data (a socket's queue) also has ``drain(timeout_s) -> int``:
    hand over everything already received, until nothing more arrives or ``timeout_s``
    passed, and return how many batches it left unread (counted, not delivered). It is
    called once, from the polling thread, before ``close``. A tap whose ``poll`` may wait on
    a peer (an HTTP request) has ``interrupt()``, called from another thread at a stop: it
    ends a poll in flight at once.

    A tap that connects to its source may say it has no working connection (``connection_problem()
    -> str | None``: never connected, refused, not the protocol it expects); the runner shows
    it as state ``not connected`` until the tap connects.
    """

    name: str
    stats: object
    poll_every_s: float

    def open(self) -> object: ...

    def poll(self, timeout_s: float) -> int: ...

    def close(self) -> None: ...


class BatchSink:
    """Where a tap hands its batches: the collector service's ingest. Called with one batch;
    a tap that reads several at once (a queue of shipped batches) hands them to
    :meth:`many`, which stores them in one commit. Each returns after the store took the
    batches (``None`` for one the store keeps for a retry)."""

    def __init__(self, one: Callable[[EventBatch], object],
                 many: Callable[[Sequence[EventBatch]], list]):
        self._one, self._many = one, many

    def __call__(self, batch: EventBatch) -> object:
        return self._one(batch)

    def many(self, batches: Sequence[EventBatch]) -> list:
        return self._many(batches)


# A tap is built with the service's sink: ``factory(on_batch) -> Tap``; ``on_batch`` is a
# :class:`BatchSink` (or, in a test, any callable taking one batch).
TapFactory = Callable[[Callable[[EventBatch], object]], Tap]

# How many block events a tap groups into one commit at most: two of DuckDB's row groups
# (122,880 rows each), enough for the transaction to be written straight into the file.
GROUP_COMMIT_EVENTS = 1 << 18


def commit_groups(batches: Sequence[EventBatch], max_events: int = GROUP_COMMIT_EVENTS
                  ) -> list[list[EventBatch]]:
    """``batches`` in order, cut into runs of at most ``max_events`` block events (a batch
    larger than that is a run of its own): the groups a tap commits together."""
    groups: list[list[EventBatch]] = []
    size = 0
    for batch in batches:
        rows = batch.block_events.num_rows
        if not groups or size + rows > max_events:
            groups.append([])
            size = 0
        groups[-1].append(batch)
        size += rows
    return groups

# How long a stop waits, past its grace, for a poll in flight when it was asked.
_POLL_IN_FLIGHT_S = 5.0


@dataclass(frozen=True)
class Backoff:
    """Waits between reopen attempts: ``initial_s``, doubling (``factor``) up to ``max_s``."""

    initial_s: float = 1.0
    max_s: float = 30.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (0 < self.initial_s <= self.max_s and self.factor >= 1):
            raise ValueError(f"backoff needs 0 < initial_s <= max_s and factor >= 1, got {self}")

    def delay_s(self, failures_in_a_row: int) -> float:
        return min(self.max_s, self.initial_s * self.factor ** max(0, failures_in_a_row - 1))


@dataclass(frozen=True)
class TapHealth:
    """One tap's state: ``running``, ``retrying`` (failed; reopened after ``retry_in_s``),
    ``not connected`` (open, but its source is not: ``last_error`` says why) or ``stopped``.
    ``failures_total`` counts failed opens and polls since the service started.
    For a tap whose source numbers its batches, ``sequence_gaps_total`` counts the gaps it saw
    (a publisher's batches that did not arrive: dropped, or sent while the collector was down)
    and ``lost_batches_total`` the missing batches no replay recovered; ``None`` otherwise.
    A hooks tap lists in ``sources`` each engine stream it received from (instance, batches,
    last batch time), so a user sees the plug-ins are live."""

    name: str
    kind: str
    state: str
    failures_total: int
    last_error: str | None = None
    retry_in_s: float | None = None
    sequence_gaps_total: int | None = None
    lost_batches_total: int | None = None
    endpoints: tuple[str, ...] = ()  # bound, with the port chosen for ``:0``
    sources: tuple | None = None  # a hooks tap's engine streams (``HooksTap.sources_seen``)

    @property
    def up(self) -> bool:
        return self.state == "running"

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "state": self.state,
                "failures_total": self.failures_total, "last_error": self.last_error,
                "retry_in_s": None if self.retry_in_s is None else round(self.retry_in_s, 3),
                **({"endpoints": list(self.endpoints)} if self.endpoints else {}),
                **({} if self.sources is None else {"sources": [s.to_dict() for s in self.sources]}),
                **({} if self.sequence_gaps_total is None else {
                    "sequence_gaps_total": self.sequence_gaps_total,
                    "lost_batches_total": self.lost_batches_total})}


class TapRunner:
    """Drives one tap in a daemon thread with the supervision described in the module.

    ``clock`` (monotonic seconds) times the backoff. :meth:`step` is one round, so the
    supervision can be exercised without a thread.
    """

    def __init__(self, tap: Tap, *, backoff: Backoff = Backoff(), poll_timeout_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic):
        self.tap, self.backoff, self.poll_timeout_s, self._clock = tap, backoff, poll_timeout_s, clock
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._open = False
        self._state = "stopped"
        self._failures_total = 0
        self._in_a_row = 0
        self._last_error: str | None = None
        self._retry_at: float | None = None
        self._grace_s = 0.0
        self.endpoints: tuple[str, ...] = ()  # what open() bound (a port chosen for :0)
        self.unread_batches = 0

    @property
    def failures_total(self) -> int:
        return self._failures_total

    def open(self) -> None:
        """Open the tap now, in the caller's thread; its error reaches the caller."""
        self.endpoints = tuple(self.tap.open() or ())
        self._open = True
        self._state = "running"

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name=f"kvtier-tap {self.tap.name}",
                                            daemon=True)
            self._thread.start()

    def request_stop(self, grace_s: float = 5.0) -> None:
        """Ask the thread to stop polling, drain for at most ``grace_s`` and close the tap."""
        self._grace_s = max(0.0, grace_s)
        self._stopping.set()
        interrupt = getattr(self.tap, "interrupt", None)
        if interrupt is not None:  # a scrape in flight would hold the stop until its deadline
            interrupt()

    def stop(self, grace_s: float = 5.0) -> int:
        """Stop as :meth:`request_stop` says (with the grace asked there, if it was) and wait
        for it; returns batches left unread."""
        if not self._stopping.is_set():
            self.request_stop(grace_s)
        thread, self._thread = self._thread, None
        if thread is None:
            self._finish()
        else:
            thread.join(self._grace_s + self.poll_timeout_s + _POLL_IN_FLIGHT_S)
            if thread.is_alive():  # its socket stays with it: closing it here would race
                log.warning("tap %s did not finish within its %.0f s grace; stopping without it",
                            self.tap.name, self._grace_s)
        self._state = "stopped"
        return self.unread_batches

    def _run(self) -> None:
        while not self._stopping.is_set():
            pause = self.step()
            if pause > 0:
                self._stopping.wait(pause)
        self._finish()

    def _finish(self) -> None:
        """Hand over what already reached the tap, then close it (the polling thread's last act)."""
        drain = getattr(self.tap, "drain", None)
        if self._open and drain is not None:
            try:
                self.unread_batches += drain(self._grace_s)
            except Exception as error:
                log.warning("tap %s: could not read what was left at stop: %s", self.tap.name,
                            describe(error))
        self._close()
        if self.unread_batches:
            log.warning("tap %s: %d batch(es) that had arrived were left unread at stop (the "
                        "grace of %.0f s ran out)", self.tap.name, self.unread_batches, self._grace_s)

    def step(self) -> float:
        """One round: (re)open if needed, poll; returns the seconds to wait before the next."""
        try:
            if not self._open:
                self.endpoints = tuple(self.tap.open() or ())
                self._open = True
            self.tap.poll(self.poll_timeout_s)
        except OSError as error:  # the source or its socket: reopen it
            return self._failed(error, reopen=True)
        except Exception as error:  # not the socket's fault: what waits there is kept
            return self._failed(error, reopen=False)
        if self._in_a_row:
            log.warning("tap %s works again after %d failed attempt(s)", self.tap.name, self._in_a_row)
        with self._lock:
            self._in_a_row, self._state, self._retry_at = 0, "running", None
        return float(getattr(self.tap, "poll_every_s", 0.0))

    def _failed(self, error: Exception, reopen: bool) -> float:
        message = describe(error) if reopen else f"{describe(error)} (its connection is kept)"
        with self._lock:
            self._failures_total += 1
            self._in_a_row += 1
            delay = self.backoff.delay_s(self._in_a_row)
            self._state, self._last_error = "retrying", message
            self._retry_at = self._clock() + delay
            first = self._in_a_row == 1
        if first:  # once per outage; the count and /healthz carry the rest
            log.warning("tap %s failed: %s; retrying in %.0f s, backing off to %.0f s",
                        self.tap.name, message, delay, self.backoff.max_s)
        else:
            log.debug("tap %s still failing: %s", self.tap.name, message)
        if reopen:
            self._close()
        return delay

    def _close(self) -> None:
        if self._open:
            try:
                self.tap.close()
            except Exception:  # closing a broken socket must not hide the original failure
                log.debug("closing tap %s failed", self.tap.name, exc_info=True)
            self._open = False

    def health(self) -> TapHealth:
        with self._lock:
            retry_in = None if self._retry_at is None else max(0.0, self._retry_at - self._clock())
            stats = getattr(self.tap, "stats", None)
            gaps, lost = getattr(stats, "gaps", None), getattr(stats, "lost_batches", None)
            seen = getattr(self.tap, "sources_seen", None)
            state, error = self._state, self._last_error
            problem = getattr(self.tap, "connection_problem", None)
            if state == "running" and problem is not None and (why := problem()) is not None:
                state, error = "not connected", why
            return TapHealth(self.tap.name, type(self.tap).__name__, state,
                             self._failures_total, error, retry_in, gaps,
                             None if gaps is None else lost or 0, self.endpoints,
                             None if seen is None else seen())


def drain_until_quiet(wait_s: Callable[[float], object], read: Callable[[], object],
                      timeout_s: float, quiet_s: float = 0.2) -> None:
    """A socket tap's drain: ``read()`` while ``wait_s(seconds)`` says something arrived, until
    nothing did for ``quiet_s`` (all that was sent is in) or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while (left_s := deadline - time.monotonic()) > 0:
        if not wait_s(min(quiet_s, left_s)):
            return
        read()


def count_queued(sock, zmq, limit: int) -> int:
    """Receive and count, without delivering, the messages waiting on a ZMQ socket now (at
    most ``limit``: a sender that keeps sending would never let this end)."""
    for count in range(limit):
        try:
            sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return count
    return limit


def describe(error: BaseException) -> str:
    """A one-line description of ``error`` (its message's first line, else its type), cut to
    an :func:`excerpt`: a message may quote what a peer sent."""
    text = str(error).strip().splitlines()
    return excerpt(text[0]) if text else type(error).__name__


def excerpt(text: str, limit: int = 200) -> str:
    """``text`` for a log line or ``/healthz``: control characters escaped (one line stays one
    line, a terminal's escape codes stay text) and cut to about ``limit`` characters, saying
    how many more there were. A 60 MB line from a peer becomes a short one."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])[:limit]
    left = len(text) - min(len(text), limit)
    return shown + (f"... ({left:,} more characters)" if left else "")
