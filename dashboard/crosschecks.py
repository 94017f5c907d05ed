"""The overview's cross-check warning: an engine's hooks against its own scraped ``/metrics``
(:mod:`kvtier.collector.crosscheck`), read from the segments."""

from __future__ import annotations

from kvtier.collector.crosscheck import DEFAULT_TOLERANCE, CounterCheck, checked_counter, crosscheck
from kvtier.dashboard.data import Filters, SegmentData


def crosschecks(data: SegmentData, filters: Filters, now_s: float) -> tuple[CounterCheck, ...]:
    """Every counter checked for the instances ``filters`` select (all when none is chosen),
    over the scrape intervals settled by ``now_s``."""
    tables = {"requests": "requests" if data.has_requests else None,
              "block_events": "raw_events" if data.has_events else None,
              "metric_intervals": "metric_intervals" if data.has_metrics else None}
    # the whole of the segments, not the collector's last hour: the page may show any period
    checks = crosscheck(lambda sql, params: data.df(sql, params).to_dict("records"), now_s,
                        window_s=float("inf"), tables=tables)
    return tuple(c for c in checks if (not filters.instances or c.instance in filters.instances)
                 and (not filters.engines or c.engine in filters.engines))


def disagreement(checks: tuple[CounterCheck, ...], tolerance: float = DEFAULT_TOLERANCE) -> str | None:
    """A sentence naming each counter whose sides differ by more than ``tolerance`` (a share
    of the larger side), with the engine series it was compared with and what that series
    counts, or ``None`` when all agree. Neither side is presumed right."""
    off = [c for c in checks if c.disagrees(tolerance)]
    if not off:
        return None
    parts = "; ".join(_difference(c) for c in off)
    return (f"The hooks and the engine's own /metrics differ by more than {tolerance:.0%}: "
            f"{parts}. The shares below come from the hooks' records. What the plug-ins could "
            "not ship is counted on the collector's /metrics "
            "(kvtier_recorder_dropped_events_total); none there means the engine's series counts "
            "differently in this version.")


def _difference(check: CounterCheck) -> str:
    counter = checked_counter(check.engine, check.counter)
    return (f"{check.instance} {check.counter.replace('_', ' ')}: hooks {check.hooks_total:,.0f} vs "
            f"engine {check.engine_total:,.0f} ({check.difference:+,.0f}; {counter.metric}: "
            f"{counter.engine_counts})")
