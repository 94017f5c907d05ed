"""The collector service (``kvtier collect``): taps in, one store, exports out.

Event taps (vLLM's ZMQ KV events, TensorRT-LLM's ``/kv_cache_events``; whoever runs the
service builds them and hands them in as factories, see :mod:`kvtier.collector.taps`) give batches
to ``CollectorService.ingest`` (or several at once to ``ingest_many``, one commit for
them all), which stores them idempotently and folds them into the metrics that ``/metrics``
and OTLP export. A maintenance thread writes Parquet segments for the dashboard and other
readers, and applies retention. Nothing here runs inside an engine:
taps read what engines publish, so a slow disk slows only the collector.
Ingest observers (:mod:`kvtier.collector.observers`: the live what-if curves) see every
stored batch after the metrics do, and are refreshed on the service's own thread.

:meth:`CollectorService.start` opens the store, binds ``/metrics`` (and ``/healthz`` beside
it) and opens every tap before it returns, so a service that cannot collect fails at once
(:class:`ServiceStartError`, with what it opened closed again); a tap that fails later is
supervised by its :class:`kvtier.collector.taps.TapRunner` and reported by :meth:`health`.

Nothing that reached the service is lost without a count: a write the store refuses waits in
:class:`kvtier.collector.writer.StoreWriter`'s backlog and is retried (``/healthz`` says 503
meanwhile), and :meth:`CollectorService.stop` lets every tap hand over what already reached
it (within ``stop_grace_s``) before the last export, and says what the store then holds in a
:class:`StopSummary`. Taps read the store's ledger through :attr:`CollectorService.ledger`
(:mod:`kvtier.collector.tap_ledger`), which never raises into them: a store that cannot be
read is never taken for a broken socket.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from kvtier.collector.batch import EventBatch
from kvtier.collector.crosscheck import crosscheck
from kvtier.collector.ddl import BLOCK_EVENTS_TABLE, LEDGER_TABLE, REQUESTS_TABLE
from kvtier.collector.exports.aggregate import MetricsState
from kvtier.collector.exports.differences import crosscheck_samples
from kvtier.collector.exports.prometheus import KvtierCollector, MetricsServer, Sample
from kvtier.collector.observers import IngestObserver, Observers
from kvtier.collector.periodic import Periodic
from kvtier.collector.segments import clear_note, segments_note
from kvtier.collector.store import IngestResult, TraceStore
from kvtier.collector.tap_ledger import TapLedger
from kvtier.collector.taps import (Backoff, BatchSink, Tap, TapFactory, TapHealth, TapRunner,
                                   describe)
from kvtier.collector.writer import DEFAULT_BACKLOG_BYTES, StoreWriter, WriteHealth

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectorConfig:
    """What the service runs. Servers bind to loopback unless ``metrics_host`` says otherwise."""

    store_path: Path
    segments_dir: Path | None = None
    export_every_s: float = 60.0
    retention_s: float | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = 9400
    otlp: bool = False
    otlp_interval_s: float = 10.0
    recommendation_path: Path | None = None  # exported as kvtier_recommendation_info
    instance: str = field(default_factory=socket.gethostname)
    stop_grace_s: float = 30.0  # on stop, how long taps may hand over what already arrived
    backlog_bytes: int = DEFAULT_BACKLOG_BYTES  # batches kept while the store refuses writes
    refresh_every_s: float = 10.0  # how often ingest observers turn their state into values

    def __post_init__(self) -> None:
        for name in ("export_every_s", "otlp_interval_s", "refresh_every_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not self.stop_grace_s >= 0 or self.backlog_bytes < 0:
            raise ValueError(f"stop_grace_s and backlog_bytes must be >= 0, got "
                             f"{self.stop_grace_s!r}, {self.backlog_bytes!r}")
        if self.retention_s is not None and not self.retention_s > 0:
            raise ValueError(f"retention_s must be > 0, got {self.retention_s!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in 0..65535, got {self.metrics_port}")


__all__ = ["CollectorConfig", "CollectorService", "ServiceHealth", "ServiceStartError",
           "StopSummary", "Tap", "TapFactory"]

_RETRY_EVERY_S = 0.25  # how often the writer's backlog is looked at (its backoff paces it)

# Counters in a tap's ``stats`` that count data it could not use (the tap kept running).
_DATA_ERRORS = ("bad_frames", "bad_events", "bad_bodies", "parse_errors", "bad_series",
                "callback_errors")


class ServiceStartError(OSError):
    """A part of the service could not start. ``part`` is ``"metrics"`` or a tap's ``name``
    (its endpoint), ``cause`` the underlying error (its ``errno`` is kept)."""

    def __init__(self, part: str, cause: BaseException):
        super().__init__(f"{part}: {describe(cause)}")
        self.part, self.cause = part, cause
        self.errno = getattr(cause, "errno", None)


@dataclass(frozen=True)
class ServiceHealth:
    """What ``/healthz`` shows: ``ok`` when every tap is running, the store takes writes, its
    ledger can be read and the last segment export (if any) worked; ``segments_error`` is
    that export's failure, ``read_error`` the last failed ledger read until one works."""

    taps: tuple[TapHealth, ...]
    store: WriteHealth | None
    segments_error: str | None = None
    read_error: str | None = None

    @property
    def ok(self) -> bool:
        store_ok = self.store is None or not self.store.failing
        return (all(tap.up for tap in self.taps) and store_ok and self.segments_error is None
                and self.read_error is None)

    def to_dict(self) -> dict:
        return {"status": "ok" if self.ok else "failing", "taps": [t.to_dict() for t in self.taps],
                "store": None if self.store is None else {**self.store.to_dict(),
                                                          "read_error": self.read_error},
                "ingest_errors_total": 0 if self.store is None else self.store.failures_total,
                "segments": {"state": "failing" if self.segments_error else "ok",
                             "last_error": self.segments_error}}


@dataclass(frozen=True)
class StopSummary:
    """What a stopped service leaves: the store's counts read after its last write, the
    batches that reached a tap but were not taken within the grace (``unread_batches``), and
    those the store never took (``dropped_batches``: backlog full, or still failing at stop).
    ``damage`` says the store was found damaged while it ran (its counts are then ``-1``:
    DuckDB would answer them from its catalog, which no longer matches the file)."""

    batches: int
    block_events: int
    requests: int
    unread_batches: int
    dropped_batches: int
    damage: str | None = None


class CollectorService:
    """Owns the store, the metrics state, the exporters, the taps and their threads.

    ``backoff`` paces a failed tap's reopen attempts; ``clock`` is Unix time in seconds.
    """

    def __init__(self, config: CollectorConfig, taps: Sequence[TapFactory] = (), *,
                 clock: Callable[[], float] = time.time, backoff: Backoff = Backoff(),
                 observers: Sequence[IngestObserver] = (), routes: dict | None = None):
        self.config = config
        self._routes = dict(routes or {})  # more JSON pages beside /metrics (the guardrail's)
        self._tap_factories = tuple(taps)
        self.observers = Observers(observers)
        self.clock = clock
        self._backoff = backoff
        self.store: TraceStore | None = None
        self.ledger: TapLedger | None = None  # where the store left each stream, for taps
        self.state = MetricsState(clock=clock)
        self.taps: list[Tap] = []
        self._runners: list[TapRunner] = []
        self.metrics: MetricsServer | None = None
        self._pusher = self._spans = None
        self._maintenance = Periodic(self._maintain, config.export_every_s, "kvtier-maintenance")
        self._retries = Periodic(self._retry_writes, _RETRY_EVERY_S, "kvtier-store-retry")
        self._refresher = Periodic(self.observers.refresh, config.refresh_every_s, "kvtier-observers")
        self._writer: StoreWriter | None = None
        self._segments_error: str | None = None
        self._started = False

    # ---------------------------------------------------------------- ingest

    def ingest(self, batch: EventBatch) -> IngestResult | None:
        """Store a tap's batch and export it; ``None`` while it waits for the store to take
        writes again (see :mod:`kvtier.collector.writer`). Never raises into the tap."""
        return self._writer.write(batch)

    def ingest_many(self, batches: Sequence[EventBatch]) -> list[IngestResult | None]:
        """Store several batches in one commit (a tap hands over what it read at once), then
        export each; one result per batch, as :meth:`ingest` gives."""
        return self._writer.write_many(batches)

    def _observe(self, stored: list[tuple[EventBatch, IngestResult]]) -> None:
        """Fold what one commit stored into the metrics, the spans and the observers: each
        origin's new batches joined into one (in order), so a group of small shipments costs
        the observers one call per engine stream, not one per shipment."""
        by_origin: dict = {}
        for batch, result in stored:
            if not result.duplicate:
                by_origin.setdefault(batch.origin, []).append(batch)
        for batches in by_origin.values():
            batch = EventBatch.joined(batches)
            self.state.observe(batch)
            if self._spans is not None:
                self._spans.observe(batch)
            self.observers.observe(batch)

    def _retry_writes(self) -> None:
        self._writer.retry()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "CollectorService":
        """Open the store, the HTTP server and every tap, then start the threads. Raises the
        store's error or :class:`ServiceStartError` with everything opened closed again."""
        self.store = TraceStore(self.config.store_path, clock=self.clock)
        self.ledger = TapLedger(self.store)
        self._writer = StoreWriter(self.store, self._observe, backlog_bytes=self.config.backlog_bytes)
        try:
            if self.config.segments_dir is not None:  # readers that find the store locked look here
                segments_note(self.config.store_path, self.config.segments_dir)
            self._open_parts()
        except BaseException:
            self.stop()
            raise
        return self

    def _open_parts(self) -> None:
        if self.config.metrics_port is not None:
            from kvtier.collector.exports.recommendation import RecommendationLabels

            recommendation = (RecommendationLabels(self.config.recommendation_path)
                              if self.config.recommendation_path else (lambda: None))
            collector = KvtierCollector(self.state, sources=[self._tap_samples, self._service_samples,
                                                         self.observers.samples,
                                                         self._crosscheck_samples],
                                        recommendation=recommendation)
            try:
                self.metrics = MetricsServer(collector, self.config.metrics_host,
                                             self.config.metrics_port, health=self._health_page,
                                             routes=self._routes)
            except OSError as error:
                raise ServiceStartError("metrics", error) from error
        sink = BatchSink(self.ingest, self.ingest_many)
        self.taps = [make(sink) for make in self._tap_factories]
        for tap in self.taps:
            runner = TapRunner(tap, backoff=self._backoff)
            try:
                runner.open()
            except (OSError, ValueError) as error:
                raise ServiceStartError(tap.name, error) from error
            finally:
                self._runners.append(runner)  # stop() closes whatever it opened
        if self.config.otlp:
            from kvtier.collector.exports.otlp import (
                OtlpMetricsPusher,
                RequestSpans,
                tracer_provider,
            )

            self._pusher = OtlpMetricsPusher(self.state, interval_s=self.config.otlp_interval_s).start()
            self._spans = RequestSpans(tracer_provider())
        for runner in self._runners:
            runner.start()
        self._retries.start()
        self._maintenance.start()
        if self.observers:
            self._refresher.start()
        self._started = True

    def stop(self) -> StopSummary | None:
        """Stop and close everything started (safe after a failed :meth:`start`): every tap
        first hands over what already reached it (at most ``stop_grace_s`` in all), the
        writer makes its last attempt, the last export runs, and the store's counts are read
        before it closes. ``None`` if no store was open."""
        for runner in self._runners:  # all drain at once, within one grace
            runner.request_stop(self.config.stop_grace_s)
        unread = sum(runner.stop() for runner in self._runners)
        if self._started:
            self._retries.stop()
            self._writer.close()
            if self.observers:
                self._refresher.stop()
                self.observers.finish()  # what they held back, before the last export
            self._maintenance.stop()  # its last run exports what the taps delivered
            self._started = False
        if self._pusher is not None:
            self._pusher.stop()
            self._pusher = None
        if self._spans is not None:
            self._spans.shutdown()
            self._spans = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.store is None:
            return None
        summary = self._final_counts(unread, self._writer.dropped_batches_total)
        try:
            self.store.close()
        except Exception as error:  # its last checkpoint; the WAL keeps what was committed
            log.warning("store %s: closing failed (%s); its WAL keeps every committed batch",
                        self.config.store_path, describe(error))
        clear_note(self.config.store_path)
        self.store = None
        return summary

    def _final_counts(self, unread: int, dropped: int) -> StopSummary:
        if self.store.damage is not None:
            return StopSummary(-1, -1, -1, unread, dropped, str(self.store.damage))
        try:
            counts = [self.store.count(t) for t in (LEDGER_TABLE, BLOCK_EVENTS_TABLE, REQUESTS_TABLE)]
        except Exception as error:
            log.warning("store %s: cannot count what it holds: %s", self.config.store_path,
                        describe(error))
            counts = [-1, -1, -1]
        return StopSummary(*counts, unread_batches=unread, dropped_batches=dropped)

    def health(self) -> ServiceHealth:
        return ServiceHealth(tuple(r.health() for r in self._runners),
                             None if self._writer is None else self._writer.health(),
                             self._segments_error, None if self.ledger is None else self.ledger.error)

    def _health_page(self) -> tuple[bool, dict]:
        health = self.health()
        return health.ok, health.to_dict()

    def _maintain(self) -> None:
        self.export_segments()
        self.observers.export(self.config.segments_dir)
        if self.config.retention_s is not None:
            try:
                self.store.prune(self.config.retention_s)
            except Exception as error:  # the next run prunes what this one could not
                log.warning("retention on %s failed: %s", self.config.store_path, describe(error))

    def export_segments(self) -> int:
        """Write new segments now (if a segment folder is configured); returns files written."""
        if self.config.segments_dir is None:
            return 0
        from kvtier.collector.segments import export_segments

        try:
            files = len(export_segments(self.store, self.config.segments_dir).files)
        except Exception as error:  # the next run exports the rows this one could not
            if self._segments_error is None:
                log.warning("segment export to %s failed (%s); retried every %.0f s",
                            self.config.segments_dir, describe(error), self.config.export_every_s)
            self._segments_error = describe(error)
            return 0
        if self._segments_error is not None:
            log.warning("segment export to %s works again", self.config.segments_dir)
            self._segments_error = None
        return files

    # ---------------------------------------------------------------- live samples

    def _tap_samples(self):
        for runner in self._runners:
            tap, stats = runner.tap, runner.tap.stats
            labels = {"tap": type(tap).__name__, "endpoint": tap.name,
                      "engine_instance": self.config.instance}
            errors = sum(getattr(stats, name, 0) for name in _DATA_ERRORS) + runner.failures_total
            yield Sample("kvtier_tap_errors_total", "Frames, events or polls a tap could not use, "
                         "and its failed opens", errors, labels)
            yield Sample("kvtier_tap_up", "1 while the tap runs, 0 while it is failing and retried",
                         1.0 if runner.health().up else 0.0, labels)
            yield Sample("kvtier_tap_sequence_gaps_total", "Sequence gaps a tap detected", getattr(stats, "gaps", 0), labels)
            yield Sample("kvtier_tap_lost_batches_total", "Missing batches a replay could not recover",
                         getattr(stats, "lost_batches", 0), labels)
            more = getattr(tap, "samples", None)  # a tap's own counters (an engine's drops)
            if more is not None:
                yield from more()

    def _crosscheck_samples(self):
        if self.store is None:
            return
        try:
            checks = crosscheck(lambda sql, params: self.store.query(sql, params).to_pylist(),
                                self.clock())
        except Exception:  # a failed read must not take /metrics down; the next scrape retries
            log.debug("crosscheck: the store could not be read", exc_info=True)
            return
        yield from crosscheck_samples(checks)

    def _service_samples(self):
        if self._writer is None:
            return
        health = self._writer.health()
        yield Sample("kvtier_ingest_errors_total", "Writes the store refused (each is kept and "
                     "retried)", health.failures_total, {})
        yield Sample("kvtier_store_backlog_batches", "Batches waiting for the store to take "
                     "writes again", health.backlog_batches, {})
        yield Sample("kvtier_store_dropped_batches_total", "Batches the store never took (the "
                     "backlog was full, or the store still failed at stop)",
                     health.dropped_batches_total, {})
        yield Sample("kvtier_store_up", "1 while the store takes writes, 0 while they fail",
                     0.0 if health.failing else 1.0, {})
        yield from self.ledger.samples()
