"""The cross-checks (:mod:`kvtier.collector.crosscheck`) as Prometheus samples: how far each
engine's hooks and its own /metrics differ, read from the store at scrape time.

``kvtier_crosscheck_difference``       hooks minus the engine's counter, per counter and instance
``kvtier_crosscheck_ratio``            hooks over the engine's counter (1 when both are 0)
``kvtier_crosscheck_window_end_seconds``  the end of the last settled scrape interval compared
"""

from __future__ import annotations

from typing import Iterable

from kvtier.collector.crosscheck import CounterCheck
from kvtier.collector.exports.prometheus import Sample


def crosscheck_samples(checks: Iterable[CounterCheck]) -> Iterable[Sample]:
    for check in checks:
        labels = {"engine": check.engine, "engine_instance": check.instance, "counter": check.counter}
        yield Sample("kvtier_crosscheck_difference", "An engine's hooks minus its own /metrics "
                     "counter over the same scrape intervals (0: they agree)", check.difference, labels)
        yield Sample("kvtier_crosscheck_ratio", "An engine's hooks over its own /metrics counter "
                     "over the same scrape intervals (1: they agree)", check.ratio, labels)
        yield Sample("kvtier_crosscheck_window_end_seconds", "Unix time the compared scrape "
                     "intervals end", check.window_end_s, labels)
