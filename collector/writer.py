"""The collector's writes into its store: a batch the store cannot take now is kept and
retried, never lost without a count.

A tap's batch is written at once. When a write fails (a full disk, a read-only folder, a file
size limit), the batch waits in a bounded backlog in memory, the failure is logged in one line
and shown by ``/healthz`` until a write succeeds again, and :meth:`StoreWriter.retry` (the
service calls it often) writes the backlog, oldest first, with exponential backoff between
attempts. While batches wait, new ones queue behind them, so each source reaches the store in
order. A full backlog drops its oldest batch and counts it; so does a stop that finds the
store still failing. Recovery is logged once too.

A retry is harmless when the failed write's commit did land: the store's ledger keeps each
``(source, sequence)`` once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from kvtier.collector.batch import EventBatch
from kvtier.collector.store import IngestResult, TraceStore
from kvtier.collector.taps import Backoff, describe

log = logging.getLogger(__name__)

DEFAULT_BACKLOG_BYTES = 256 << 20


@dataclass(frozen=True)
class WriteHealth:
    """The writer's state for ``/healthz`` and the metrics. ``failing`` from a failed write
    until one succeeds; ``retry_in_s`` until the next attempt while batches wait."""

    failing: bool
    last_error: str | None
    backlog_batches: int
    backlog_bytes: int
    failures_total: int
    dropped_batches_total: int
    retry_in_s: float | None

    def to_dict(self) -> dict:
        return {"state": "failing" if self.failing else "ok", "last_error": self.last_error,
                "backlog_batches": self.backlog_batches, "backlog_bytes": self.backlog_bytes,
                "failures_total": self.failures_total,
                "dropped_batches_total": self.dropped_batches_total,
                "retry_in_s": None if self.retry_in_s is None else round(self.retry_in_s, 3)}


def batch_bytes(batch: EventBatch) -> int:
    return sum(table.nbytes for table in batch.tables().values())


class StoreWriter:
    """Writes batches into ``store`` as the module says; thread-safe (taps write from their
    threads, the service retries from its own). ``on_stored(stored)`` sees every batch the
    store took, duplicates included, as ``(batch, result)`` pairs in order: those of one
    commit in one call. ``clock`` is monotonic seconds (times the backoff)."""

    def __init__(self, store: TraceStore,
                 on_stored: Callable[[list[tuple[EventBatch, IngestResult]]], None], *,
                 backlog_bytes: int = DEFAULT_BACKLOG_BYTES,
                 backoff: Backoff = Backoff(initial_s=0.5, max_s=30.0),
                 clock: Callable[[], float] = time.monotonic):
        if backlog_bytes < 0:
            raise ValueError(f"backlog_bytes must be >= 0, got {backlog_bytes}")
        self.store, self._on_stored = store, on_stored
        self.backlog_limit_bytes, self._backoff, self._clock = backlog_bytes, backoff, clock
        self._writing = threading.Lock()  # one write at a time, so the backlog keeps its order
        self._backlog: deque[tuple[EventBatch, int]] = deque()
        self._backlog_bytes = 0
        self._in_a_row = 0
        self._retry_at: float | None = None
        self._last_error: str | None = None
        self._closed = False
        self.failures_total = 0
        self.dropped_batches_total = 0

    def write(self, batch: EventBatch) -> IngestResult | None:
        """Store ``batch`` now, or keep it for a retry (``None`` then). Never raises."""
        return self.write_many([batch])[0]

    def write_many(self, batches: Sequence[EventBatch]) -> list[IngestResult | None]:
        """Store ``batches`` now in one commit (the store's group commit), or keep them for
        a retry; one result per batch, ``None`` for a batch kept. Never raises. When the
        group's commit fails, each batch is written on its own, so one that cannot be stored
        is kept (or dropped) exactly as :meth:`write` would keep it, and the rest go on."""
        batches = list(batches)
        with self._writing:
            if self._closed:
                self._drop(len(batches), "the collector had stopped writing")
                return [None] * len(batches)
            results: list[IngestResult | None] = []
            if not self._backlog and len(batches) > 1:
                try:
                    results = list(self.store.ingest_many(batches))
                except Exception:  # the batches one by one below say which failed, and why
                    results = []
            if not results:
                results = [self._write_one(batch) for batch in batches]
        stored = [(batch, result) for batch, result in zip(batches, results) if result is not None]
        if stored:
            self._on_stored(stored)
        return results

    def _write_one(self, batch: EventBatch) -> IngestResult | None:
        if self._backlog:  # behind what already waits
            self._keep(batch)
            return None
        try:
            return self.store.ingest(batch)
        except Exception as error:
            self._failed(error)
            self._keep(batch)
            return None

    def retry(self, *, now: bool = False) -> int:
        """Write the backlog, oldest first, if its retry is due (or ``now``); returns batches
        written. Stops at the first failure, which backs the next attempt off."""
        stored = []
        with self._writing:
            if not self._backlog or not (now or self._clock() >= self._retry_at):
                return 0
            while self._backlog:
                batch, size = self._backlog[0]
                try:
                    result = self.store.ingest(batch)
                except Exception as error:
                    self._failed(error)
                    break
                self._backlog.popleft()
                self._backlog_bytes -= size
                stored.append((batch, result))
            else:
                self._recovered()
        if stored:
            self._on_stored(stored)
        return len(stored)

    def close(self) -> int:
        """Last attempt at the backlog; what still waits is dropped and counted, and later
        writes are counted as dropped. Returns the batches dropped now."""
        self.retry(now=True)
        with self._writing:
            self._closed = True
            left = len(self._backlog)
            if left:
                self._drop(left, "the store still failed at stop")
                self._backlog.clear()
                self._backlog_bytes = 0
            return left

    def health(self) -> WriteHealth:
        with self._writing:
            retry_in = (max(0.0, self._retry_at - self._clock())
                        if self._backlog and self._retry_at is not None else None)
            return WriteHealth(self._in_a_row > 0, self._last_error, len(self._backlog),
                               self._backlog_bytes, self.failures_total,
                               self.dropped_batches_total, retry_in)

    # ------------------------------------------------------------------ with _writing held

    def _failed(self, error: Exception) -> None:
        self.failures_total += 1
        self._in_a_row += 1
        self._last_error = describe(error)
        delay = self._backoff.delay_s(self._in_a_row)
        self._retry_at = self._clock() + delay
        if self._in_a_row == 1:  # once per outage; /healthz and the metrics carry the rest
            log.warning("store %s: a write failed (%s); keeping batches in memory (at most %d "
                        "MiB) and retrying, backing off to %.0f s", self.store.path,
                        self._last_error, self.backlog_limit_bytes >> 20, self._backoff.max_s)

    def _recovered(self) -> None:
        if self._in_a_row:
            log.warning("store %s: writes work again after %d failed attempt(s)", self.store.path,
                        self._in_a_row)
        self._in_a_row, self._retry_at, self._last_error = 0, None, None

    def _keep(self, batch: EventBatch) -> None:
        size = batch_bytes(batch)
        while self._backlog and self._backlog_bytes + size > self.backlog_limit_bytes:
            _, dropped = self._backlog.popleft()
            self._backlog_bytes -= dropped
            self._drop(1, "the backlog was full")
        if size > self.backlog_limit_bytes:
            self._drop(1, "the batch is larger than the backlog")
            return
        self._backlog.append((batch, size))
        self._backlog_bytes += size

    def _drop(self, count: int, why: str) -> None:
        first = self.dropped_batches_total == 0
        self.dropped_batches_total += count
        if first:  # the count on /healthz and in the metrics goes on from here
            log.warning("store %s: dropping %d batch(es): %s", self.store.path, count, why)
