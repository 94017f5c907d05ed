"""Prometheus text exposition -> per-interval values: counter increases, gauges, histograms.

Pure: text and times in, :class:`ScrapeInterval` out. The lexing is prometheus_client's
parser; the classification of samples is done here, by ``# TYPE`` where the parser kept it
and by suffix otherwise (the parser loses the type of some ``name:with:colons_total``
counters, as vLLM's are, and adds ``_total`` to counters that lack it, as Rust exporters'
do): ``*_total`` is a counter, ``*_bucket{le}``/``*_sum``/``*_count`` of a histogram are a
histogram, ``*_created`` is the counter's start time, everything else is a gauge.

Counters become increases over the interval. A counter that went down, or whose
``_created`` time moved, was reset (the engine restarted): its increase is its new value.
A series that first appears after the first scrape is counted from 0 (prometheus_client
creates labelled children lazily); on the first scrape there is no interval yet.
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
    restarted. All mappings are read-only.
    """

    engine: str
    instance: str
    start_s: float
    end_s: float
    counters: Mapping[SeriesKey, float] = field(default_factory=dict)
    gauges: Mapping[SeriesKey, float] = field(default_factory=dict)
    histograms: Mapping[SeriesKey, HistogramDelta] = field(default_factory=dict)
    resets: tuple[SeriesKey, ...] = ()

    def __post_init__(self) -> None:
        if not self.end_s >= self.start_s:
            raise ValueError(f"end_s {self.end_s} is before start_s {self.start_s}")
        for name in ("counters", "gauges", "histograms"):
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
    """One scrape, classified: counters and their start times, gauges, histograms."""

    time_s: float
    counters: dict[SeriesKey, float]
    created: dict[SeriesKey, float]
    gauges: dict[SeriesKey, float]
    histograms: dict[SeriesKey, HistogramDelta]


def parse_snapshot(text: str, time_s: float, prefixes: tuple[str, ...] = ()) -> Snapshot:
    """Classify the samples of an exposition; keep names starting with one of ``prefixes``
    (all if empty). Raises ``ValueError`` for text that is not Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    declared, samples = {}, []
    for family in text_string_to_metric_families(text):
        declared[family.name] = family.type
        samples.extend(family.samples)
    counters, created, gauges = {}, {}, {}
    hist_parts: dict[SeriesKey, dict] = {}
    for s in samples:
        if prefixes and not s.name.startswith(prefixes):
            continue
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        key_labels = tuple(sorted(labels.items()))
        base, kind = _classify(s.name, s.labels, declared)
        if kind == "bucket":
            hist_parts.setdefault(SeriesKey(base, key_labels), {}).setdefault(
                "buckets", []).append((float(s.labels["le"]), float(s.value)))
        elif kind in ("sum", "count"):
            hist_parts.setdefault(SeriesKey(base, key_labels), {})[kind] = float(s.value)
        elif kind == "created":
            created[SeriesKey(base + "_total", key_labels)] = float(s.value)
        elif kind == "counter":
            counters[SeriesKey(s.name, key_labels)] = float(s.value)
        else:
            gauges[SeriesKey(s.name, key_labels)] = float(s.value)
    histograms = {k: HistogramDelta(tuple(sorted(p.get("buckets", []))), p.get("sum", 0.0),
                                    p.get("count", 0.0))
                  for k, p in hist_parts.items()}
    return Snapshot(time_s, counters, created, gauges, histograms)


def _classify(name: str, labels: dict, declared: dict) -> tuple[str, str]:
    for suffix, kind in (("_bucket", "bucket"), ("_sum", "sum"), ("_count", "count")):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and declared.get(base) == "histogram":
            return base, kind
    if name.endswith("_bucket") and "le" in labels:
        return name[:-7], "bucket"
    if name.endswith("_created"):
        return name[:-8], "created"
    if name.endswith("_total") or declared.get(name) == "counter":
        return name, "counter"
    return name, "gauge"


def interval_between(before: Snapshot, after: Snapshot, engine: str,
                     instance: str) -> ScrapeInterval:
    """The interval from ``before`` to ``after``, with resets handled (see module doc)."""
    counters, resets = {}, []
    for key, value in after.counters.items():
        old = before.counters.get(key, 0.0)
        restarted = key in before.created and after.created.get(key) != before.created[key]
        if value < old or restarted:
            resets.append(key)
            counters[key] = value
        else:
            counters[key] = value - old
    histograms = {}
    for key, hist in after.histograms.items():
        old = before.histograms.get(key)
        if old is None:
            histograms[key] = hist
        elif hist.count < old.count:
            resets.append(key)
            histograms[key] = hist
        else:
            histograms[key] = _subtract(hist, old)
    return ScrapeInterval(engine, instance, before.time_s, after.time_s, counters,
                          dict(after.gauges), histograms, tuple(sorted(resets)))


def _subtract(new: HistogramDelta, old: HistogramDelta) -> HistogramDelta:
    old_at = dict(old.buckets)
    buckets = tuple((b, max(0.0, c - old_at.get(b, 0.0))) for b, c in new.buckets)
    return HistogramDelta(buckets, max(0.0, new.sum - old.sum), new.count - old.count)
