"""Metric scrapers: one HTTP scraper for every engine, told where and what to read by its
profile (:mod:`kvtier.probes.scrape.profiles`).

:class:`MetricScraper` turns each scrape after the first into a
:class:`kvtier.probes.scrape.intervals.ScrapeInterval` handed to ``on_interval``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from kvtier.collector.taps import excerpt
from kvtier.probes.polling import FetchError, PollLoop, check_url, fetch
from kvtier.probes.scrape.intervals import ScrapeInterval, Snapshot, carried, interval_between
from kvtier.probes.scrape.page import PageError, parse_snapshot
from kvtier.probes.scrape.profiles import profile

log = logging.getLogger(__name__)


#: The shortest pause between two scrapes of one page: each one costs the engine a render.
MIN_INTERVAL_S = 0.1


def check_interval(interval_s: float) -> None:
    """``ValueError`` unless ``interval_s`` is a number of seconds >= :data:`MIN_INTERVAL_S`."""
    if not interval_s >= MIN_INTERVAL_S or interval_s == float("inf"):
        raise ValueError(f"interval_s must be at least {MIN_INTERVAL_S:g} s (and finite), "
                         f"got {interval_s!r}")


@dataclass(frozen=True)
class ScraperConfig:
    """``url`` defaults to the engine's usual loopback endpoint. ``also`` names further
    profiles whose families are kept too (LMCache's, served by the vLLM process it runs in)."""

    engine: str
    url: str | None = None
    instance: str = "local"
    interval_s: float = 10.0
    timeout_s: float = 5.0
    also: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for engine in (self.engine, *self.also):
            profile(engine)
        if self.url is not None:
            check_url(self.url)
        check_interval(self.interval_s)
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")

    @property
    def endpoint(self) -> str:
        return self.url or profile(self.engine).default_url

    @property
    def prefixes(self) -> tuple[str, ...]:
        return tuple(p for engine in (self.engine, *self.also) for p in profile(engine).prefixes)


@dataclass
class ScrapeStats:
    """Counters since the scraper started: ``parse_errors`` counts pages refused whole (see
    :mod:`kvtier.probes.scrape.page`), ``bad_series`` series left out of a page they were on."""

    scrapes: int = 0
    intervals: int = 0
    fetch_errors: int = 0
    parse_errors: int = 0
    bad_series: int = 0
    callback_errors: int = 0


class MetricScraper:
    """GET the engine's metrics each round; hand the interval since the last good scrape to
    ``on_interval``. A failed scrape leaves the baseline where it was, so the next interval
    spans the gap (increases are not lost, only less finely placed in time)."""

    def __init__(self, config: ScraperConfig, on_interval: Callable[[ScrapeInterval], None], *,
                 clock: Callable[[], float] = time.time):
        self.config, self._on_interval, self._clock = config, on_interval, clock
        self._prefixes = config.prefixes
        self._last: Snapshot | None = None
        self.stats = ScrapeStats()
        self._loop = PollLoop(self.poll, config.interval_s, f"kvtier-scrape-{config.engine}")
        self.start, self.stop = self._loop.start, self._loop.stop

    def poll(self) -> ScrapeInterval | None:
        """One scrape; the new interval, or ``None`` (first scrape, or a failure). Never raises."""
        self.stats.scrapes += 1
        try:
            body = fetch(self.config.endpoint, timeout_s=self.config.timeout_s)
        except FetchError as exc:
            self.stats.fetch_errors += 1
            log.warning("scrape of %s failed: %s", self.config.endpoint, excerpt(str(exc)))
            return None
        try:
            return self.ingest_text(body.decode("utf-8", errors="replace"))
        except PageError as exc:
            log.warning("unusable metrics from %s: %s", self.config.endpoint, exc)
            return None

    def ingest_text(self, text: str) -> ScrapeInterval | None:
        """Use exposition text obtained elsewhere (a file, a multiprocess registry): the
        interval since the last usable page, or ``None`` for the first. :class:`PageError`
        (counted in ``parse_errors``; the baseline stays) for a page refused whole, or one
        whose every series of the profile broke a rule."""
        try:
            snapshot = parse_snapshot(text, self._clock(), self._prefixes)
        except PageError:
            self.stats.parse_errors += 1
            raise
        self.stats.bad_series += sum(snapshot.refused.values())
        if snapshot.refused and not snapshot.has_series:
            self.stats.parse_errors += 1
            reasons = ", ".join(sorted(snapshot.refused))
            raise PageError(f"every {self.config.engine} series on the page broke a rule ({reasons})")
        before = self._last
        self._last = snapshot if before is None else carried(before, snapshot)
        if before is None:
            return None
        interval = interval_between(before, snapshot, self.config.engine, self.config.instance)
        self.stats.intervals += 1
        try:
            self._on_interval(interval)
        except Exception:
            self.stats.callback_errors += 1
            log.exception("scraper %s: on_interval failed", self.config.engine)
        return interval
