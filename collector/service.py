"""The collector service (``kvtier collect``): taps in, one store, exports out.

Event taps (vLLM's ZMQ KV events, TensorRT-LLM's ``/kv_cache_events``; whoever runs the
service builds them and hands them in as factories, see :mod:`kvtier.collector.taps`) give batches
to ``CollectorService.ingest``, which stores them idempotently and folds them into the
metrics that ``/metrics`` and OTLP export. A maintenance thread writes Parquet segments for
the dashboard and other readers, and applies retention. Nothing here runs inside an engine:
taps read what engines publish, so a slow disk slows only the collector.

:meth:`CollectorService.start` opens the store, binds ``/metrics`` (and ``/healthz`` beside
it) and opens every tap before it returns, so a service that cannot collect fails at once
(:class:`ServiceStartError`, with what it opened closed again); a tap that fails later is
supervised by its :class:`kvtier.collector.taps.TapRunner` and reported by :meth:`health`.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from kvtier.collector.batch import EventBatch
from kvtier.collector.exports.aggregate import MetricsState
from kvtier.collector.exports.prometheus import KvtierCollector, MetricsServer, Sample
from kvtier.collector.periodic import Periodic
from kvtier.collector.segments import clear_note, segments_note
from kvtier.collector.store import IngestResult, TraceStore
from kvtier.collector.taps import Backoff, Tap, TapFactory, TapHealth, TapRunner, describe

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

    def __post_init__(self) -> None:
        for name in ("export_every_s", "otlp_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.retention_s is not None and not self.retention_s > 0:
            raise ValueError(f"retention_s must be > 0, got {self.retention_s!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be in 0..65535, got {self.metrics_port}")


__all__ = ["CollectorConfig", "CollectorService", "ServiceHealth", "ServiceStartError", "Tap",
           "TapFactory"]

# Counters in a tap's ``stats`` that count data it could not use (the tap kept running).
_DATA_ERRORS = ("bad_frames", "bad_events", "bad_bodies", "parse_errors", "callback_errors")


class ServiceStartError(OSError):
    """A part of the service could not start. ``part`` is ``"metrics"`` or a tap's ``name``
    (its endpoint), ``cause`` the underlying error (its ``errno`` is kept)."""

    def __init__(self, part: str, cause: BaseException):
        super().__init__(f"{part}: {describe(cause)}")
        self.part, self.cause = part, cause
        self.errno = getattr(cause, "errno", None)


@dataclass(frozen=True)
class ServiceHealth:
    """What ``/healthz`` shows: ``ok`` when every tap is running."""

    taps: tuple[TapHealth, ...]
    ingest_errors_total: int

    @property
    def ok(self) -> bool:
        return all(tap.up for tap in self.taps)

    def to_dict(self) -> dict:
        return {"status": "ok" if self.ok else "failing", "taps": [t.to_dict() for t in self.taps],
                "ingest_errors_total": self.ingest_errors_total}


class CollectorService:
    """Owns the store, the metrics state, the exporters, the taps and their threads.

    ``backoff`` paces a failed tap's reopen attempts; ``clock`` is Unix time in seconds.
    """

    def __init__(self, config: CollectorConfig, taps: Sequence[TapFactory] = (), *,
                 clock: Callable[[], float] = time.time, backoff: Backoff = Backoff()):
        self.config = config
        self._tap_factories = tuple(taps)
        self.clock = clock
        self._backoff = backoff
        self.store: TraceStore | None = None
        self.state = MetricsState(clock=clock)
        self.taps: list[Tap] = []
        self._runners: list[TapRunner] = []
        self.metrics: MetricsServer | None = None
        self._pusher = self._spans = None
        self._maintenance = Periodic(self._maintain, config.export_every_s, "kvtier-maintenance")
        self._started = False
        self.ingest_errors = 0

    # ---------------------------------------------------------------- ingest

    def ingest(self, batch: EventBatch) -> IngestResult | None:
        """Store a tap's batch and export it. Never raises into the tap."""
        try:
            result = self.store.ingest(batch)
        except Exception:
            self.ingest_errors += 1
            log.exception("could not store batch %s/%d", batch.origin.source, batch.sequence)
            return None
        if not result.duplicate:
            self.state.observe(batch)
            if self._spans is not None:
                self._spans.observe(batch)
        return result

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "CollectorService":
        """Open the store, the HTTP server and every tap, then start the threads. Raises the
        store's error or :class:`ServiceStartError` with everything opened closed again."""
        self.store = TraceStore(self.config.store_path, clock=self.clock)
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
            collector = KvtierCollector(self.state, sources=[self._tap_samples, self._service_samples],
                                        recommendation=recommendation)
            try:
                self.metrics = MetricsServer(collector, self.config.metrics_host,
                                             self.config.metrics_port, health=self._health_page)
            except OSError as error:
                raise ServiceStartError("metrics", error) from error
        self.taps = [make(self.ingest) for make in self._tap_factories]
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
        self._maintenance.start()
        self._started = True

    def stop(self) -> None:
        """Stop and close everything started (safe after a failed :meth:`start`)."""
        for runner in self._runners:
            runner.stop()
        if self._started:
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
        if self.store is not None:
            self.store.close()
            clear_note(self.config.store_path)
            self.store = None

    def health(self) -> ServiceHealth:
        return ServiceHealth(tuple(r.health() for r in self._runners), self.ingest_errors)

    def _health_page(self) -> tuple[bool, dict]:
        health = self.health()
        return health.ok, health.to_dict()

    def _maintain(self) -> None:
        self.export_segments()
        if self.config.retention_s is not None:
            self.store.prune(self.config.retention_s)

    def export_segments(self) -> int:
        """Write new segments now (if a segment folder is configured); returns files written."""
        if self.config.segments_dir is None:
            return 0
        from kvtier.collector.segments import export_segments

        try:
            return len(export_segments(self.store, self.config.segments_dir).files)
        except Exception:
            log.exception("segment export to %s failed", self.config.segments_dir)
            return 0

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

    def _service_samples(self):
        yield Sample("kvtier_ingest_errors_total", "Batches the store could not take", self.ingest_errors, {})
