"""Scraped pages -> per-interval values: counter increases, gauges, histograms.

Pure: snapshots (:mod:`kvtier.probes.scrape.page` makes them from a page's text) and times
in, :class:`ScrapeInterval` out.

Counters become increases over the interval. A counter that went down, or whose
``_created`` time moved, was reset (the engine restarted): its increase is its new value.
A series that first appears after the first scrape is counted from 0 (prometheus_client
creates labelled children lazily); on the first scrape there is no interval yet. A series
missing from a page (left off it, or refused for a bad value) keeps its last value
(:func:`carried`), so no increase is ever invented from a gap.
:meth:`ScrapeInterval.records` gives the store's rows (the schema's ``MetricInterval``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

from kvtier.collector.events import MetricInterval

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, order=True)
class SeriesKey:
    """One time series: metric sample name (``..._total`` for counters) and sorted labels."""

    name: str
    labels: Labels = ()

    def label(self, name: str) -> str | None:
        return dict(self.labels).get(name)

    @property
    def labels_text(self) -> str:
        """The labels as Prometheus writes them between braces: ``a="1",b="x"``."""
        return ",".join(f'{k}="{_escaped(v)}"' for k, v in self.labels)

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        have = dict(self.labels)
        return self.name == name and all(have.get(k) == v for k, v in labels.items())


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    """Observations in one interval: cumulative ``buckets`` as (upper bound, count)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def quantile(self, q: float) -> float | None:
        """Prometheus' ``histogram_quantile``: linear inside the bucket; ``None`` if empty."""
        if not 0 <= q <= 1:
            raise ValueError(f"q must be in 0..1, got {q!r}")
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.buckets[-1][1]
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in self.buckets:
            if count >= rank:
                if math.isinf(bound):
                    return lower_bound
                width = count - lower_count
                frac = 0.0 if width <= 0 else (rank - lower_count) / width
                return lower_bound + (bound - lower_bound) * frac
            lower_bound, lower_count = bound, count
        return lower_bound

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


@dataclass(frozen=True)
class ScrapeInterval:
    """What one engine's metrics did between two scrapes (``start_s`` to ``end_s``, Unix s).

    ``counters`` are increases (never negative), ``gauges`` the values at ``end_s``,
    ``histograms`` the observations made in the interval; ``resets`` names the series that
    restarted; ``refused`` counts, by reason, the series the page at ``end_s`` held with a
    value that broke a rule (left out). All mappings are read-only.
    """

    engine: str
    instance: str
    start_s: float
    end_s: float
    counters: Mapping[SeriesKey, float] = field(default_factory=dict)
    gauges: Mapping[SeriesKey, float] = field(default_factory=dict)
    histograms: Mapping[SeriesKey, HistogramDelta] = field(default_factory=dict)
    resets: tuple[SeriesKey, ...] = ()
    refused: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.end_s >= self.start_s:
            raise ValueError(f"end_s {self.end_s} is before start_s {self.start_s}")
        for name in ("counters", "gauges", "histograms", "refused"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def records(self) -> tuple[MetricInterval, ...]:
        """One schema row per series: counters' increases, gauges' values, histograms'
        observation counts and sums (buckets are left out), resets flagged."""
        resets = set(self.resets)
        span = (self.start_s, self.end_s)
        rows = [MetricInterval(*span, k.name, "counter", v, k.labels_text, reset=int(k in resets))
                for k, v in sorted(self.counters.items())]
        rows += [MetricInterval(*span, k.name, "gauge", v, k.labels_text)
                 for k, v in sorted(self.gauges.items())]
        rows += [MetricInterval(*span, k.name, "histogram", h.count, k.labels_text, h.sum,
                                int(k in resets)) for k, h in sorted(self.histograms.items())]
        return tuple(rows)

    def gauge(self, name: str, **labels: str) -> float | None:
        values = [v for k, v in self.gauges.items() if k.matches(name, labels)]
        return sum(values) if values else None

    def histogram(self, name: str, **labels: str) -> HistogramDelta | None:
        """The merged histogram ``name`` (without ``_bucket``) over matching series."""
        parts = [v for k, v in self.histograms.items() if k.matches(name, labels)]
        return merge_histograms(parts) if parts else None


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def merge_histograms(parts: Iterable[HistogramDelta]) -> HistogramDelta:
    """Sum histograms with the same bucket bounds (series of one metric)."""
    parts = list(parts)
    bounds = sorted({b for p in parts for b, _ in p.buckets})
    buckets = tuple((b, sum(_cumulative_at(p, b) for p in parts)) for b in bounds)
    return HistogramDelta(buckets, sum(p.sum for p in parts), sum(p.count for p in parts))


def _cumulative_at(hist: HistogramDelta, bound: float) -> float:
    below = [c for b, c in hist.buckets if b <= bound]
    return below[-1] if below else 0.0


# ---------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class Snapshot:
    """One scrape, classified (:func:`kvtier.probes.scrape.page.parse_snapshot`): counters
    and their start times, gauges, histograms. ``refused`` counts the series left out because
    a value broke a rule, by reason; ``unknown`` names series seen without a usable value (on
    this page, or on every page since they appeared)."""

    time_s: float
    counters: dict[SeriesKey, float]
    created: dict[SeriesKey, float]
    gauges: dict[SeriesKey, float]
    histograms: dict[SeriesKey, HistogramDelta]
    refused: Mapping[str, int] = field(default_factory=dict)
    unknown: frozenset[SeriesKey] = frozenset()

    @property
    def has_series(self) -> bool:
        return bool(self.counters or self.gauges or self.histograms)


def carried(before: Snapshot, after: Snapshot) -> Snapshot:
    """``after`` as the next interval's baseline: a counter or histogram missing from it (left
    off the page, or refused) keeps its last value from ``before``, so its next increase is
    counted from there and never from 0; one never seen with a usable value stays unknown."""
    counters = {**before.counters, **after.counters}
    histograms = {**before.histograms, **after.histograms}
    unknown = frozenset(k for k in before.unknown | after.unknown
                        if k not in counters and k not in histograms)
    return Snapshot(after.time_s, counters, {**before.created, **after.created}, after.gauges,
                    histograms, after.refused, unknown)


def interval_between(before: Snapshot, after: Snapshot, engine: str,
                     instance: str) -> ScrapeInterval:
    """The interval from ``before`` to ``after``, with resets handled (see module doc)."""
    counters, resets = {}, []
    for key, value in after.counters.items():
        if key in before.unknown:  # its last value was never usable: this page is its baseline
            continue
        old = before.counters.get(key, 0.0)
        restarted = (key in before.created and key in after.created
                     and after.created[key] != before.created[key])
        if value < old or restarted:
            resets.append(key)
            counters[key] = value
        else:
            counters[key] = value - old
    histograms = {}
    for key, hist in after.histograms.items():
        old = before.histograms.get(key)
        if key in before.unknown:
            continue
        if old is None:
            histograms[key] = hist
        elif hist.count < old.count:
            resets.append(key)
            histograms[key] = hist
        else:
            histograms[key] = _subtract(hist, old)
    return ScrapeInterval(engine, instance, before.time_s, after.time_s, counters,
                          dict(after.gauges), histograms, tuple(sorted(resets)), after.refused)


def _subtract(new: HistogramDelta, old: HistogramDelta) -> HistogramDelta:
    old_at = dict(old.buckets)
    buckets = tuple((b, max(0.0, c - old_at.get(b, 0.0))) for b, c in new.buckets)
    return HistogramDelta(buckets, max(0.0, new.sum - old.sum), new.count - old.count)
