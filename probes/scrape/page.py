"""One scraped Prometheus page -> a :class:`kvtier.probes.scrape.intervals.Snapshot`, its values
checked where they enter.

The lexing is prometheus_client's parser; the classification of samples is done here, by
``# TYPE`` where the parser kept it and by suffix otherwise (the parser loses the type of some
``name:with:colons_total`` counters, as vLLM's are, and adds ``_total`` to counters that lack
it, as Rust exporters' do): ``*_total`` is a counter, ``*_bucket{le}``/``*_sum``/``*_count``
of a histogram are a histogram, ``*_created`` is the counter's start time, everything else
is a gauge.

Each cumulative value meets the schema's rule for metric values
(:func:`kvtier.collector.events.metric_value_problem`: finite, counters and histogram counts
never negative), the rule the store applies to every ``MetricInterval``; a histogram's
buckets must not decrease. A series that breaks one is left out of the snapshot, counted by
reason (``Snapshot.refused``, the batch's rejections) and logged with a short excerpt; the
rest of the page is kept, and the series keeps its last value
(:func:`kvtier.probes.scrape.intervals.carried`). A page that does not parse, or that holds
one series twice, is refused whole (:class:`PageError`), as Prometheus refuses a page with a
duplicate sample.
"""

from __future__ import annotations

import math
from collections import defaultdict

from kvtier.collector.columns import Rejections
from kvtier.collector.events import metric_value_problem
from kvtier.collector.taps import excerpt
from kvtier.probes.scrape.intervals import HistogramDelta, SeriesKey, Snapshot

# Longer lines are not read: the parser spends about 0.3 us a character in Python, so one
# 60 MB line would hold the collector for 17 s (a label holding a whole config is ~1 KB).
MAX_LINE_CHARS = 1 << 16
DECREASING_BUCKETS = "histogram buckets decrease"
BAD_BUCKET_BOUND = "histogram bucket bound not a number"


class PageError(ValueError):
    """A page refused whole; the message is one short line, whatever the page held."""


def parse_snapshot(text: str, time_s: float, prefixes: tuple[str, ...] = ()) -> Snapshot:
    """Classify and check the samples of an exposition (see module doc); keep names starting
    with one of ``prefixes`` (all if empty). :class:`PageError` for a page refused whole."""
    declared, samples = _samples(text)
    _refuse_duplicates(samples)
    parts = _Parts()
    for sample in samples:
        if not prefixes or sample.name.startswith(prefixes):
            parts.add(sample, declared)
    return parts.snapshot(time_s)


def _samples(text: str) -> tuple[dict[str, str], list]:
    from prometheus_client.parser import text_string_to_metric_families

    longest = max(map(len, text.split("\n")))
    if longest > MAX_LINE_CHARS:
        raise PageError(f"not Prometheus text exposition (a line of {longest:,} characters; "
                        f"lines above {MAX_LINE_CHARS:,} are not read); the page begins "
                        f"{excerpt(text, 80)!r}")
    declared, samples = {}, []
    try:
        for family in text_string_to_metric_families(text):
            declared[family.name] = family.type
            samples.extend(family.samples)
    except (ValueError, TypeError, IndexError, KeyError) as error:
        raise PageError(f"not Prometheus text exposition ({excerpt(str(error) or type(error).__name__)}); "
                        f"the page begins {excerpt(text, 80)!r}") from None
    return declared, samples


def _refuse_duplicates(samples: list) -> None:
    seen = set()
    for sample in samples:
        key = (sample.name, tuple(sorted(sample.labels.items())))
        if key in seen:
            raise PageError(f"the page holds the series {excerpt(_text(sample.name, sample.labels))} "
                            "twice; refused whole, as Prometheus refuses it")
        seen.add(key)


def _text(name: str, labels: dict, value: float | None = None) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" + ("" if value is None else f" {value!r}")


class _Parts:
    """The samples of one page by series, with each series' first broken rule."""

    def __init__(self) -> None:
        self.counters: dict[SeriesKey, float] = {}
        self.created: dict[SeriesKey, float] = {}
        self.gauges: dict[SeriesKey, float] = {}
        self.histograms: dict[SeriesKey, dict] = defaultdict(lambda: {"buckets": []})
        self.broken: dict[SeriesKey, tuple[str, str]] = {}  # key -> (reason, sample text)

    def add(self, sample, declared: dict[str, str]) -> None:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        base, kind = _classify(sample.name, sample.labels, declared)
        value = float(sample.value)
        if kind in ("bucket", "sum", "count"):
            key = SeriesKey(base, labels)
            self._check(key, sample, "histogram", value if kind != "sum" else 0.0,
                        value if kind == "sum" else None)
            self._histogram_part(key, kind, sample, value)
        elif kind == "created":  # a start time: finite, as any value
            key = SeriesKey(base + "_total", labels)
            self._check(key, sample, "gauge", value)
            self.created[key] = value
        elif kind == "counter":
            key = SeriesKey(sample.name, labels)
            self._check(key, sample, "counter", value)
            self.counters[key] = value
        else:
            key = SeriesKey(sample.name, labels)
            self._check(key, sample, "gauge", value)
            self.gauges[key] = value

    def _check(self, key: SeriesKey, sample, kind: str, value: float, sum_value=None) -> None:
        problem = metric_value_problem(kind, value, sum_value)
        if problem is not None:
            self._broke(key, problem, sample)

    def _broke(self, key: SeriesKey, reason: str, sample) -> None:
        if key not in self.broken:
            self.broken[key] = (reason, _text(sample.name, sample.labels, sample.value))

    def _histogram_part(self, key: SeriesKey, kind: str, sample, value: float) -> None:
        if kind != "bucket":
            self.histograms[key][kind] = value
            return
        try:
            bound = float(sample.labels["le"])
        except (KeyError, ValueError):
            bound = math.nan
        if math.isnan(bound) or bound == -math.inf:
            self._broke(key, BAD_BUCKET_BOUND, sample)
        else:
            self.histograms[key]["buckets"].append((bound, value))

    def snapshot(self, time_s: float) -> Snapshot:
        histograms = {}
        for key, part in self.histograms.items():
            buckets = tuple(sorted(part["buckets"]))
            if any(later < earlier for (_, earlier), (_, later) in zip(buckets, buckets[1:])):
                self.broken.setdefault(key, (DECREASING_BUCKETS, excerpt(repr(buckets))))
            histograms[key] = HistogramDelta(buckets, part.get("sum", 0.0), part.get("count", 0.0))
        refused = Rejections()
        for reason, example in self.broken.values():
            refused.add(reason, example=excerpt(example))
        keep = lambda values: {k: v for k, v in values.items() if k not in self.broken}  # noqa: E731
        return Snapshot(time_s, keep(self.counters), keep(self.created), keep(self.gauges),
                        keep(histograms), dict(refused), frozenset(self.broken))


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
