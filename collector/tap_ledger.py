"""The store's batch ledger as the collector's taps read it: where a stream left off.

A tap that meets a stream for the first time asks the ledger where the store left it (a
restarted collector goes on from there and counts what it missed). Those reads never raise
into the tap: a store that cannot be read (a damaged file, a disk fault) is no fault of the
tap's socket, and a supervisor that took it for one would close the socket and lose what
waits in its queue. A failed read is logged once per outage, counted
(``kvtier_store_read_errors_total``) and shown on ``/healthz`` (:attr:`TapLedger.error`);
the tap goes on as for a stream the store never saw, which only costs the count of what was
missed while the collector was down.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, TypeVar

from kvtier.collector.store import TraceStore
from kvtier.collector.taps import describe

log = logging.getLogger(__name__)

Answer = TypeVar("Answer")


class TapLedger:
    """Ledger reads for taps, as the module says; thread-safe (each tap reads from its own
    thread)."""

    def __init__(self, store: TraceStore):
        self.store = store
        self._lock = threading.Lock()
        self._error: str | None = None
        self.errors_total = 0

    @property
    def error(self) -> str | None:
        """The last failed read, until a read works again."""
        return self._error

    def next_sequence(self, source: str) -> int | None:
        """The next sequence the store expects from ``source`` (a hooks tap resuming an
        engine's stream); ``None`` when it holds none or cannot be read now."""
        return self._read(lambda: self.store.next_sequence(source))

    def latest_source(self, prefix: str) -> tuple[str, int] | None:
        """The stored source starting with ``prefix`` that stored last, and its highest
        sequence (a ZMQ event tap resuming a stream); ``None`` when there is none or the
        store cannot be read now."""
        return self._read(lambda: self.store.latest_source(prefix))

    def _read(self, read: Callable[[], Answer | None]) -> Answer | None:
        try:
            answer = read()
        except Exception as error:  # whatever the store raised: never the tap's
            with self._lock:
                first, self._error = self._error is None, describe(error)
                self.errors_total += 1
            if first:
                log.warning("store %s: its batch ledger cannot be read (%s); taps go on without "
                            "knowing where it left their streams", self.store.path, self._error)
            return None
        with self._lock:
            recovered, self._error = self._error is not None, None
        if recovered:
            log.warning("store %s: its batch ledger can be read again", self.store.path)
        return answer

    def samples(self):
        """``kvtier_store_read_errors_total``, as a ``kvtier.collector.exports.prometheus.Sample``."""
        from kvtier.collector.exports.prometheus import Sample

        yield Sample("kvtier_store_read_errors_total", "Reads of the store's batch ledger that "
                     "failed (a damaged store?); the taps went on without them",
                     self.errors_total, {})
