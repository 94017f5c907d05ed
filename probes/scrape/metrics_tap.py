"""A metric scraper as a collector tap (``kvtier collect --scrape URL[=PROFILE]``).

Each poll GETs the engine's Prometheus page; each interval after the first scrape becomes one
:class:`kvtier.collector.batch.EventBatch` of ``MetricInterval`` rows (the schema's), so the
intervals are stored beside the engine's block events and requests. Without a profile, the
first page's series names choose it (:func:`kvtier.probes.scrape.scraper.guess_profiles`): the
most matched engine, with the families of every other engine the page also holds (LMCache's in
a vLLM process); a named profile keeps only its own. A page that cannot be fetched, or holds no known engine's series, is a tap
failure (the collector's supervisor reports it on ``/healthz`` and retries); a page that does
not parse is counted in ``stats.parse_errors``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin
from kvtier.probes.polling import fetch
from kvtier.probes.scrape.intervals import ScrapeInterval
from kvtier.probes.scrape.scraper import (
    PROFILES,
    MetricScraper,
    ScrapeStats,
    ScraperConfig,
    guess_profiles,
)


@dataclass(frozen=True)
class ScrapeTapConfig:
    """``engine`` is a :data:`~kvtier.probes.scrape.scraper.PROFILES` key, or ``None`` to
    guess it from the page."""

    url: str
    engine: str | None = None
    instance: str = "local"
    interval_s: float = 10.0
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be http(s), got {self.url!r}")
        if self.engine is not None and self.engine not in PROFILES:
            raise ValueError(f"unknown profile {self.engine!r}; known: {', '.join(PROFILES)}")
        for name in ("interval_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


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

    def poll(self, timeout_s: float = 0.0) -> int:
        """One scrape; returns the batches delivered (0 for the baseline). ``OSError`` when
        the page cannot be fetched, ``ValueError`` when it holds no known engine's series."""
        text = fetch(self.config.url, timeout_s=self.config.timeout_s).decode("utf-8", "replace")
        scraper = self._scraper or self._start(text)
        return 0 if scraper.ingest_text(text) is None else 1

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
        batch = EventBatch.from_intervals(self._origin, self._sequence, interval.records())
        self._sequence += 1
        self._on_batch(batch)
