"""The cross-checks (:mod:`kvtier.collector.crosscheck`) as Prometheus samples: how far each
engine's hooks and its own /metrics differ, read from the store at scrape time.

``kvtier_crosscheck_difference``       hooks minus the engine's counter, per counter and instance
                                       (``engine_metric`` names the engine's series; the HELP
                                       text says what each counts)
``kvtier_crosscheck_ratio``            hooks over the engine's counter (1 when both are 0)
``kvtier_crosscheck_window_end_seconds``  the end of the last settled scrape interval compared
"""

from __future__ import annotations

from typing import Iterable

from kvtier.collector.crosscheck import COUNTERS, CounterCheck, checked_counter
from kvtier.collector.exports.prometheus import Sample


# what each engine series counts, in the HELP text (one line, as the exposition format wants)
_COUNTS = "engine series: " + "; ".join(
    f"{c.metric} ({engine} {c.name}): {c.engine_counts}"
    for engine, counters in sorted(COUNTERS.items()) for c in counters)


def crosscheck_samples(checks: Iterable[CounterCheck]) -> Iterable[Sample]:
    for check in checks:
        counter = checked_counter(check.engine, check.counter)
        labels = {"engine": check.engine, "engine_instance": check.instance, "counter": check.counter,
                  "engine_metric": counter.metric}
        yield Sample("kvtier_crosscheck_difference", "An engine's hooks minus its own /metrics "
                     f"series engine_metric over the same scrape intervals (0: they agree); {_COUNTS}",
                     check.difference, labels)
        yield Sample("kvtier_crosscheck_ratio", "An engine's hooks over its own /metrics series "
                     "engine_metric over the same scrape intervals (1: they agree)", check.ratio, labels)
        yield Sample("kvtier_crosscheck_window_end_seconds", "Unix time the compared scrape "
                     "intervals end", check.window_end_s, labels)

