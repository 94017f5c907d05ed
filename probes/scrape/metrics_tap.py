"""A metric scraper as a collector tap (``kvtier collect --scrape URL[=PROFILE]``).

Each poll GETs the engine's Prometheus page, whole within ``timeout_s`` (a page that trickles
in fails at that deadline, and a stop ends a scrape in flight at once: :meth:`ScrapeTap.interrupt`);
each interval after the first scrape becomes one
:class:`kvtier.collector.batch.EventBatch` of ``MetricInterval`` rows (the schema's), so the
intervals are stored beside the engine's block events and requests; the series a page held
with values that break the schema's rules are left out and counted in the batch's rejections
(:mod:`kvtier.probes.scrape.page`). Without a profile, the first page's series names choose
it (:func:`kvtier.probes.scrape.profiles.guess_profiles`): the most matched engine, with the
families of every other engine the page also holds (LMCache's in a vLLM process); a named
profile keeps only its own. A page that cannot be fetched whole, holds no known engine's
series, does not parse, holds a series twice or only series that break the rules is a tap
failure: the collector's supervisor reports it on ``/healthz`` (with the reason, cut short)
and retries; the baseline stays at the last usable page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from kvtier.collector.batch import EventBatch
from kvtier.collector.columns import Rejections
from kvtier.collector.events import Origin
from kvtier.probes.polling import Deadline, check_url, fetch
from kvtier.probes.scrape.intervals import ScrapeInterval
from kvtier.probes.scrape.profiles import PROFILES, guess_profiles
from kvtier.probes.scrape.scraper import MetricScraper, ScrapeStats, ScraperConfig, check_interval


class UnusablePage(OSError):
    """The engine served a page kvtier cannot use: its source is broken, as an unreachable one
    is (the :class:`kvtier.collector.taps.Tap` protocol's ``OSError``)."""


@dataclass(frozen=True)
class ScrapeTapConfig:
    """``engine`` is a :data:`~kvtier.probes.scrape.profiles.PROFILES` key, or ``None`` to
    guess it from the page. ``interval_s`` is at least
    :data:`~kvtier.probes.scrape.scraper.MIN_INTERVAL_S`; ``timeout_s`` bounds a whole scrape."""

    url: str
    engine: str | None = None
    instance: str = "local"
    interval_s: float = 10.0
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        check_url(self.url)
        if self.engine is not None and self.engine not in PROFILES:
            raise ValueError(f"unknown profile {self.engine!r}; known: {', '.join(PROFILES)}")
        check_interval(self.interval_s)
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")


class ScrapeTap:
    """Scrape ``config.url`` every ``interval_s``; hand each interval's rows to ``on_batch``
    (the :class:`kvtier.collector.taps.Tap` protocol). ``clock`` is Unix seconds."""

    def __init__(self, config: ScrapeTapConfig, on_batch: Callable[[EventBatch], object], *,
                 clock: Callable[[], float] = time.time):
        self.config, self._on_batch, self._clock = config, on_batch, clock
        self.poll_every_s = config.interval_s
        self._scraper: MetricScraper | None = None
        self._origin: Origin | None = None
        self._sequence = 0
        self._no_scrapes = ScrapeStats()
        self._in_flight: Deadline | None = None

    @property
    def name(self) -> str:
        return self.config.url

    @property
    def engine(self) -> str | None:
        """The profile in use (``None`` until a guessed one is chosen)."""
        return None if self._scraper is None else self._scraper.config.engine

    @property
    def stats(self) -> ScrapeStats:
        return self._no_scrapes if self._scraper is None else self._scraper.stats

    def open(self) -> None:
        """Nothing to bind: the first poll reaches the engine."""

    def close(self) -> None:
        """Nothing held between polls."""

    def interrupt(self) -> None:
        """End the scrape in flight now (called from another thread at a stop)."""
        in_flight = self._in_flight
        if in_flight is not None:
            in_flight.interrupt()

    def poll(self, timeout_s: float = 0.0) -> int:
        """One scrape; returns the batches delivered (0 for the baseline). ``OSError`` when
        the page cannot be fetched whole in ``config.timeout_s``, ``ValueError`` when it is
        unusable (:class:`UnusablePage`, see module doc)."""
        self._in_flight = Deadline(self.config.timeout_s)
        try:
            body = fetch(self.config.url, timeout_s=self.config.timeout_s, deadline=self._in_flight)
        finally:
            self._in_flight = None
        text = body.decode("utf-8", "replace")
        try:
            scraper = self._scraper or self._start(text)
            return 0 if scraper.ingest_text(text) is None else 1
        except ValueError as error:
            raise UnusablePage(str(error)) from None

    def _start(self, text: str) -> MetricScraper:
        # a named profile keeps its own families; a guessed one those of every engine found
        found = (self.config.engine,) if self.config.engine else guess_profiles(text)
        engine = found[0] if found else None
        if engine is None:
            raise ValueError(f"{self.config.url} serves no series of a known engine "
                             f"({', '.join(PROFILES)}); name the profile: URL=PROFILE")
        scraper_config = ScraperConfig(
            engine, self.config.url, self.config.instance, self.config.interval_s,
            self.config.timeout_s, also=tuple(e for e in found if e != engine))
        self._origin = Origin(engine, self.config.instance, f"{engine}-scrape:"
                              f"{self.config.instance}:{self.config.url}:{int(self._clock() * 1000)}")
        self._scraper = MetricScraper(scraper_config, self._deliver, clock=self._clock)
        return self._scraper

    def _deliver(self, interval: ScrapeInterval) -> None:
        batch = EventBatch.from_intervals(self._origin, self._sequence, interval.records(),
                                          Rejections(interval.refused))
        self._sequence += 1
        self._on_batch(batch)
