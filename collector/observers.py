"""Ingest observers: live state the collector keeps from every stored batch, beside its
metrics (the live what-if curves, which the command line plugs in from ``policy/``).

An observer's fault never stops the ingest or ``/metrics``: :class:`Observers` counts and
logs it (once; ``kvtier_observer_errors_total`` counts the rest) and goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Iterator, Protocol, Sequence

from kvtier.collector.batch import EventBatch
from kvtier.collector.exports.prometheus import Sample

log = logging.getLogger(__name__)


class IngestObserver(Protocol):
    """``observe(batch)`` runs on the ingest path, in the thread that stored the batch (a
    duplicate is not shown; the batches of one engine stream stored by one commit come as one,
    :meth:`EventBatch.joined`): it must be quick and wait on nothing slow. ``refresh()`` turns
    the state into values on the service's own thread; ``flush()`` takes in whatever it still
    holds back (at stop); ``samples()`` gives the last values at scrape time and
    ``export(folder)`` writes them beside the segments (each export, and at stop)."""

    def observe(self, batch: EventBatch) -> None: ...

    def refresh(self) -> object: ...

    def flush(self) -> None: ...

    def samples(self) -> Iterable[Sample]: ...

    def export(self, folder: Path) -> object: ...


class Observers:
    """The service's observers, each call guarded as the module says."""

    def __init__(self, observers: Sequence[IngestObserver] = ()):
        self.members = tuple(observers)
        self.errors_total = 0

    def __bool__(self) -> bool:
        return bool(self.members)

    def observe(self, batch: EventBatch) -> None:
        for observer in self.members:
            self._guarded(observer, "observe", batch)

    def refresh(self) -> None:
        for observer in self.members:
            self._guarded(observer, "refresh")

    def finish(self) -> None:
        """At stop: everything held back taken in, and the values refreshed."""
        for observer in self.members:
            self._guarded(observer, "flush")
            self._guarded(observer, "refresh")

    def export(self, folder: Path | None) -> None:
        if folder is not None:
            for observer in self.members:
                self._guarded(observer, "export", folder)

    def samples(self) -> Iterator[Sample]:
        if not self.members:
            return
        yield Sample("kvtier_observer_errors_total", "Failures of the live observers (the "
                     "curves); the ingest went on", self.errors_total, {})
        for observer in self.members:
            try:
                yield from list(observer.samples())
            except Exception:  # a failed read must not take /metrics down
                self._failed(observer, "samples")

    def _guarded(self, observer: IngestObserver, what: str, *args) -> None:
        try:
            getattr(observer, what)(*args)
        except Exception:
            self._failed(observer, what)

    def _failed(self, observer: IngestObserver, what: str) -> None:
        self.errors_total += 1
        if self.errors_total == 1:
            log.warning("%s.%s failed; the ingest goes on (kvtier_observer_errors_total counts "
                        "further failures)", type(observer).__name__, what, exc_info=True)
