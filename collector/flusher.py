"""The background flusher: drains a recorder into the store, off the engine's path.

A batch the store fails to take (disk full, a locked file) is kept and retried with the same
sequence number, so the retry is idempotent; while a batch waits, new events keep
accumulating in the recorder's bounded buffer (and are dropped and counted if it fills).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from kvtier.collector.batch import EventBatch
from kvtier.collector.periodic import Periodic
from kvtier.collector.recorder import Recorder
from kvtier.collector.store import IngestResult, TraceStore
from kvtier.collector.taps import describe

log = logging.getLogger(__name__)


class Flusher:
    """Moves batches from ``recorder`` to ``store`` every ``interval_s`` seconds.

    ``on_ingest(batch, result)`` (optional) sees every stored batch with its
    ``IngestResult``: the hook for metrics and trace exporters. It runs on the flusher's
    thread; an exception in it is logged and does not stop the flusher.
    Use as a context manager, or ``start()``/``stop()``; ``stop`` drains what is left.
    """

    def __init__(self, recorder: Recorder, store: TraceStore, *, interval_s: float = 0.5,
                 on_ingest: Callable[[EventBatch, IngestResult], None] | None = None):
        self.recorder = recorder
        self.store = store
        self.interval_s = interval_s
        self._on_ingest = on_ingest
        self._pending: EventBatch | None = None
        self._flushing = threading.Lock()  # flush() may run on the thread and a caller at once
        self._loop = Periodic(self.flush, interval_s, "kvtier-flusher")
        self.batches_stored = 0
        self.rows_stored = 0
        self.failures = 0
        self._failing = 0  # failed attempts in a row

    def flush_once(self) -> IngestResult | None:
        """Store the pending batch or the next one drained; ``None`` if there was nothing."""
        with self._flushing:
            return self._flush_locked()

    def _flush_locked(self) -> IngestResult | None:
        batch = self._pending or self.recorder.take_events()
        if batch is None:
            return None
        self._pending = batch
        try:
            result = self.store.ingest(batch)
        except Exception as error:
            self.failures += 1
            self._failing += 1
            if self._failing == 1:  # once per outage: a full disk would repeat it every interval
                log.warning("store %s rejected batch %s/%d (%s); retrying every %g s", self.store.path,
                            batch.origin.source, batch.sequence, describe(error), self.interval_s)
            return None
        if self._failing:
            log.warning("store %s takes writes again after %d failed attempt(s)", self.store.path,
                        self._failing)
            self._failing = 0
        self._pending = None
        self.batches_stored += 0 if result.duplicate else 1
        self.rows_stored += result.stored
        if self._on_ingest is not None and not result.duplicate:
            try:
                self._on_ingest(batch, result)
            except Exception:
                log.exception("on_ingest hook failed for batch %s/%d", batch.origin.source, batch.sequence)
        return result

    def flush(self) -> int:
        """Drain until the recorder is empty or the store fails. Returns batches handled."""
        handled = 0
        while self.flush_once() is not None:
            handled += 1
        return handled

    def start(self) -> "Flusher":
        self._loop.start()
        return self

    def stop(self) -> None:
        """Stop the background thread and drain what is left."""
        self._loop.stop()

    def __enter__(self) -> "Flusher":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
