"""The collector's end of the engine-side shipper: a ZMQ PULL socket (``kvtier collect
--hooks``) that turns shipped batches (``collector/shipment.py``) into ``EventBatch``es.

Engines' shippers connect to it; it binds (loopback by default; one socket may bind several
endpoints). Each message is validated and converted with the same rules as every other
source, then handed to ``on_batch`` (the collector service's ingest: the store's ledger
keeps each ``(source, sequence)`` once, so nothing is stored twice). What one poll finds
queued is handed over together, in groups of up to ``HooksTapConfig.commit_events`` block
events that the store commits at once: a busy collector commits a few large transactions, not
one per engine shipment. A group goes in as soon as it is full, so the tap holds at most one
group (and the message that did not fit) ahead of the store.

Per source it keeps what the engine reported and what it saw: the engine's cumulative drops
(``dropped_events_total``: recorder buffer full or a batch the engine could not send; the
largest value seen wins, since counters only grow) and what went missing on the way (a
``sequence`` gap counts the lost batches, a ``first_event`` jump the lost events). ``resume(source)``, when given, says where the
store's ledger left a source (the next sequence it expects), so a restarted collector counts
batches lost while it was down too.
:meth:`HooksTap.samples` exports them as ``kvtier_recorder_dropped_events_total`` etc. A
batch the store already has (a restarted collector, a replay) is not counted as a gap.

On stop, :meth:`HooksTap.drain` hands over what already reached the socket before it closes:
the endpoints stay bound meanwhile, since unbinding would drop what ZMQ has received and not
yet handed over.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kvtier.collector.peer_monitor import PeerMonitor
from kvtier.collector.shipment import ShipmentError, decode
from kvtier.collector.taps import (GROUP_COMMIT_EVENTS, commit_groups, count_queued,
                                   drain_until_quiet)

log = logging.getLogger(__name__)

DEFAULT_HOOKS_ENDPOINT = "tcp://127.0.0.1:5570"


@dataclass(frozen=True)
class HooksTapConfig:
    """Endpoints to bind (``tcp://HOST:PORT`` or ``ipc://PATH``) and the receive queue.

    A message above ``max_message_bytes`` is skipped, counted as a bad frame and logged; one
    above twice that is cut off by ZMQ itself (the sender's connection is dropped, so memory
    stays bounded): the tap counts and logs that disconnect (``kvtier_hooks_disconnects_total``).
    Keep the limit above what engines ship (a recorder's default capacity holds 64 MiB of block
    records): a shipment cut off after its first frame can trip an assertion in libzmq that
    aborts the collector (zeromq/libzmq#3442). ``commit_events``: block events the store
    commits at once at most (a group of shipments read together; one larger shipment is a
    group of its own), which is also what the tap reads ahead of the store."""

    endpoints: tuple[str, ...] = (DEFAULT_HOOKS_ENDPOINT,)
    queue_batches: int = 1000
    max_message_bytes: int = 256 << 20
    commit_events: int = GROUP_COMMIT_EVENTS

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("at least one hooks endpoint is needed, e.g. " + DEFAULT_HOOKS_ENDPOINT)
        for endpoint in self.endpoints:
            if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://")):
                raise ValueError(f"hooks endpoint must be tcp://HOST:PORT or ipc://PATH, got {endpoint!r}")
        if self.queue_batches < 1 or self.max_message_bytes < 1 or self.commit_events < 1:
            raise ValueError(f"queue_batches, max_message_bytes and commit_events must be >= 1, "
                             f"got {self.queue_batches}, {self.max_message_bytes}, "
                             f"{self.commit_events}")


@dataclass
class SourceCounters:
    """One engine stream as the tap sees it."""

    engine: str
    instance: str
    next_sequence: int = 0
    next_event: int = 0
    dropped_events_total: int = 0
    dropped_requests_total: int = 0
    dropped_steps_total: int = 0
    lost_batches: int = 0
    lost_events: int = 0
    batches: int = 0
    last_batch_s: float | None = None  # Unix seconds
    guardrail_rejected: dict[str, int] = field(default_factory=dict)  # reason -> cumulative


@dataclass(frozen=True)
class SourceSeen:
    """One engine stream the tap has received from, for ``/healthz``: its plug-ins are live
    while ``last_batch_s`` (Unix seconds) keeps moving."""

    source: str
    engine: str
    instance: str
    batches: int
    last_batch_s: float

    def to_dict(self) -> dict:
        return {"source": self.source, "engine": self.engine, "instance": self.instance,
                "batches": self.batches, "last_batch_s": round(self.last_batch_s, 3)}


@dataclass
class HooksTapStats:
    """Counters since the tap started; ``sources`` by source name."""

    batches: int = 0
    block_events: int = 0
    requests: int = 0
    step_records: int = 0
    bad_frames: int = 0
    callback_errors: int = 0
    disconnects: int = 0
    sources: dict[str, SourceCounters] = field(default_factory=dict)

    @property
    def gaps(self) -> int:
        return sum(s.lost_batches > 0 for s in self.sources.values())

    @property
    def lost_batches(self) -> int:
        return sum(s.lost_batches for s in self.sources.values())


class HooksTap:
    """PULL shipped batches; hand each to ``on_batch`` (see module doc). A
    :class:`kvtier.collector.taps.Tap`: the service's runner opens it, polls it from one thread and
    closes it."""

    poll_every_s = 0.0  # poll() itself waits

    def __init__(self, config: HooksTapConfig, on_batch: Callable[[object], object], *,
                 resume: Callable[[str], int | None] | None = None,
                 clock: Callable[[], float] = time.time):
        self.config = config
        self._clock = clock
        self._on_batch = on_batch
        self._resume = resume
        self.stats = HooksTapStats()
        self._lock = threading.Lock()  # stats: read by /metrics while the thread writes
        self._context = self._socket = self._monitor = None
        self._bound: list[str] = []
        self.name = ",".join(config.endpoints)

    def open(self) -> list[str]:
        """Bind the endpoints (idempotent); ``OSError`` if one cannot be bound. Returns the
        endpoints bound (with the port chosen for ``:0``)."""
        if self._socket is not None:
            return self._bound
        import zmq

        self._context = zmq.Context()
        socket = self._context.socket(zmq.PULL)
        socket.setsockopt(zmq.RCVHWM, self.config.queue_batches)
        # ZMQ drops a connection silently on a frame above MAXMSGSIZE; up to twice the limit
        # a message is received, so that it is counted and logged as a bad frame instead
        socket.setsockopt(zmq.MAXMSGSIZE, 2 * self.config.max_message_bytes)
        socket.setsockopt(zmq.LINGER, 0)
        monitor = PeerMonitor(socket, f"hooks tap {self.name}", 2 * self.config.max_message_bytes)
        try:
            for endpoint in self.config.endpoints:
                socket.bind(endpoint)
                self._bound.append(socket.getsockopt_string(zmq.LAST_ENDPOINT))
        except zmq.ZMQError as error:
            monitor.close()
            socket.close()
            self._context.term()
            self._context, self._bound = None, []
            raise OSError(error.errno, f"cannot bind hooks endpoint {endpoint}: {error.strerror}") from None
        self._socket, self._monitor = socket, monitor
        return self._bound

    @property
    def bound(self) -> list[str]:
        """The endpoints bound (empty before :meth:`open`)."""
        return list(self._bound)

    def close(self) -> None:
        if self._socket is not None:
            self._count_disconnects()
            self._monitor.close()
            self._socket.close(linger=0)
            self._context.term()
        self._socket = self._context = self._monitor = None

    def poll(self, timeout_s: float = 0.0, max_messages: int = 100) -> int:
        """Wait up to ``timeout_s`` for a message, deliver what is there (at most
        ``max_messages``, so a stop is not kept waiting); returns batches delivered."""
        import zmq

        self.open()
        received, events = [], 0  # what is queued now, handed over together (group commits)
        delivered = 0
        try:
            poller = zmq.Poller()  # a disconnect wakes it too, so it is counted at once
            poller.register(self._socket, zmq.POLLIN)
            poller.register(self._monitor.events, zmq.POLLIN)
            ready = dict(poller.poll(int(timeout_s * 1000)))
            self._count_disconnects()
            if self._socket not in ready:
                return 0
            for _ in range(max_messages):
                try:
                    frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    break
                decoded = self._decoded(frames)
                if decoded is None:
                    continue
                received.append(decoded)
                events += decoded[1].block_events.num_rows
                if events >= self.config.commit_events:  # a full group goes in now
                    delivered += self._deliver(received)
                    received, events = [], 0
        except zmq.ZMQError as error:  # a broken socket: the runner reopens it
            self._deliver(received)  # what was read before it broke is not lost
            raise OSError(f"hooks endpoint {self.name}: {error}") from None
        return delivered + self._deliver(received)

    def drain(self, timeout_s: float) -> int:
        """Deliver what already reached the socket, until nothing more arrives for a moment
        or ``timeout_s`` passed; then count, without delivering, what is still queued.
        Returns that count (batches left unread)."""
        import zmq

        if self._socket is None:
            return 0
        try:
            drain_until_quiet(lambda s: self._socket.poll(int(s * 1000)),
                              lambda: self.poll(0.0, max_messages=1), timeout_s)
            return count_queued(self._socket, zmq, self.config.queue_batches)
        except zmq.ZMQError as error:
            raise OSError(f"hooks endpoint {self.name}: {error}") from None

    def _count_disconnects(self) -> None:
        seen = self._monitor.read()
        if seen:
            with self._lock:
                self.stats.disconnects += seen

    def _decoded(self, frames):
        """``(shipment, batch)``, or ``None`` for a bad message (counted and logged)."""
        size = sum(len(frame) for frame in frames)
        if size > self.config.max_message_bytes:
            self._bad_frame(f"a message of {size} bytes is above the limit of "
                            f"{self.config.max_message_bytes} bytes")
            return None
        try:
            shipment = decode(frames)
            return shipment, shipment.packed.to_event_batch(shipment.sequence)
        except ShipmentError as error:
            self._bad_frame(str(error))
            return None

    def _deliver(self, received: list) -> int:
        """Hand the batches over in order, each group of them in one commit where the sink
        takes several (``on_batch.many``); returns the batches handed over."""
        many = getattr(self._on_batch, "many", None)
        shipments = {id(batch): shipment for shipment, batch in received}
        groups = (commit_groups([batch for _, batch in received], self.config.commit_events)
                  if many is not None
                  else [[batch] for _, batch in received])
        delivered, failure = 0, None
        for group in groups:
            try:
                results = many(group) if many is not None else [self._on_batch(group[0])]
            except Exception:
                with self._lock:
                    self.stats.callback_errors += len(group)
                log.exception("hooks tap: ingest of %d batch(es) from %s/%d failed", len(group),
                              group[0].origin.source, group[0].sequence)
                continue
            for batch, result in zip(group, results):
                try:
                    self._count(shipments[id(batch)], batch,
                                duplicate=getattr(result, "duplicate", False))
                except Exception as error:  # the store could not say where a stream resumes:
                    failure = failure or error  # the rest, read off the socket, still go in
            delivered += len(group)
        if failure is not None:
            raise failure
        return delivered

    def _bad_frame(self, reason: str) -> int:
        with self._lock:
            self.stats.bad_frames += 1
            count = self.stats.bad_frames
        log.log(logging.WARNING if count <= 10 else logging.DEBUG,
                "hooks tap: bad message skipped (%s); %d so far", reason, count)
        return 0

    def _count(self, shipment, batch, duplicate: bool) -> None:
        origin = batch.origin
        with self._lock:
            stats = self.stats
            source = stats.sources.get(origin.source)
            if source is None:
                resumed = self._resume(origin.source) if self._resume is not None else None
                start = shipment.sequence if resumed is None else min(resumed, shipment.sequence)
                source = stats.sources[origin.source] = SourceCounters(
                    origin.engine, origin.instance, start, shipment.first_event)
            if not duplicate and shipment.sequence >= source.next_sequence:
                source.lost_batches += shipment.sequence - source.next_sequence
                source.lost_events += max(0, shipment.first_event - source.next_event)
                source.next_sequence = shipment.sequence + 1
                source.next_event = shipment.first_event + shipment.packed.num_events
            source.dropped_events_total = max(source.dropped_events_total,
                                              shipment.dropped_events_total)
            source.dropped_requests_total = max(source.dropped_requests_total,
                                                shipment.dropped_requests_total)
            source.dropped_steps_total = max(source.dropped_steps_total,
                                             shipment.dropped_steps_total)
            for reason, count in shipment.packed.guardrail_rejected:
                source.guardrail_rejected[reason] = max(count, source.guardrail_rejected.get(reason, 0))
            source.batches += 1
            source.last_batch_s = self._clock()
            stats.batches += 1
            stats.block_events += batch.block_events.num_rows
            stats.requests += batch.requests.num_rows
            stats.step_records += batch.step_records.num_rows

    def sources_seen(self) -> tuple[SourceSeen, ...]:
        """Each engine stream received from, by source name (``/healthz``)."""
        with self._lock:
            return tuple(SourceSeen(name, s.engine, s.instance, s.batches, s.last_batch_s)
                         for name, s in sorted(self.stats.sources.items())
                         if s.last_batch_s is not None)

    def samples(self):
        """Drop and loss counters per engine and instance (summed over its streams), as
        ``kvtier.collector.exports.prometheus.Sample`` values."""
        from kvtier.collector.exports.prometheus import Sample

        totals: dict[tuple[str, str], list[int]] = {}
        rejected: dict[tuple[str, str, str], int] = {}
        with self._lock:
            disconnects = self.stats.disconnects
            for s in self.stats.sources.values():
                acc = totals.setdefault((s.engine, s.instance), [0, 0, 0, 0, 0])
                for i, value in enumerate((s.dropped_events_total, s.dropped_requests_total,
                                           s.lost_batches, s.lost_events, s.dropped_steps_total)):
                    acc[i] += value
                for reason, count in s.guardrail_rejected.items():
                    key = (s.engine, s.instance, reason)
                    rejected[key] = rejected.get(key, 0) + count
        for (engine, instance), (events, requests, batches, lost, steps) in sorted(totals.items()):
            labels = {"engine": engine, "engine_instance": instance}
            yield Sample("kvtier_recorder_dropped_events_total", "Block events an engine's "
                         "recorder or shipper dropped (buffer full, no collector)", events, labels)
            yield Sample("kvtier_recorder_dropped_requests_total", "Request records an engine's "
                         "recorder or shipper dropped", requests, labels)
            yield Sample("kvtier_recorder_dropped_steps_total", "Step records an engine's "
                         "recorder or shipper dropped", steps, labels)
            yield Sample("kvtier_hooks_lost_batches_total", "Shipped batches that never arrived "
                         "(sequence gaps)", batches, labels)
            yield Sample("kvtier_hooks_lost_events_total", "Block events in shipped batches that "
                         "never arrived", lost, labels)
        for (engine, instance, reason), count in sorted(rejected.items()):
            yield Sample("kvtier_guardrail_rejected_messages_total", "Control messages an engine's "
                         "connector dropped (malformed, unauthorised, stale, over its rate), by "
                         "reason", count, {"engine": engine, "engine_instance": instance,
                                           "reason": reason})
        yield Sample("kvtier_hooks_disconnects_total", "Senders' connections the hooks endpoint "
                     "lost (an engine stopped, or ZMQ cut off a message above twice the size "
                     "limit)", disconnects, {"endpoint": self.name})
