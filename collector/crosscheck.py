"""Cross-checks in production: what an engine's hooks recorded against the engine's own
``/metrics`` counters (``kvtier collect --hooks`` and ``--scrape`` for one instance).

Both are summed over the same time window, aligned on the scrape intervals: a counter's
side is its increase over the intervals (``metric_intervals``), the hooks' side the tokens
of the requests that finished within those intervals (``arrival_s + e2e_latency_s``), or the
block events timed within them. Only intervals ending ``settle_s`` before now count, so a
request that finished but is not yet shipped is not read as a disagreement. A request that
starts in one interval and finishes in the next moves its tokens between neighbouring
intervals only, so the sums over the whole window agree when both sides count alike.

The counters compared per engine are :data:`COUNTERS`, each with what the engine's series
counts (``engine_counts``): a pair is compared only where both sides count the same thing,
so a difference is a loss or a double count on one side, not two definitions. An engine
without an entry, or an instance without both sources, is not checked. The rows come from a
caller's query function (the collector's store, the dashboard's segments); the result is a
tuple of :class:`CounterCheck` values.

vLLM's series that look comparable and are not (0.32 and 0.33, ``vllm/v1/kv_offload/cpu/manager.py``):
``vllm:kv_offload_cpu_allocation_size`` observes, in ``CPUOffloadingManager.prepare_store``,
the chunks each store *asks* for, before the allocation can fail for lack of evictable
chunks; a failed store (one ``vllm:kv_offload_allocation_failure``, whatever its size) is
asked again at the next step and observed again. Its sum is the chunks stored only while no
allocation fails; with a CPU tier full of chunks in flight it runs far ahead of them. The
stores that happened are ``vllm:kv_offload_store_bytes``, which the workers count when a
store completes, as the hooks record one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

from kvtier.collector.ddl import WITH_ORIGIN

DEFAULT_SETTLE_S = 5.0
# Each /metrics scrape compares the last hour: a bounded query however long the store has run
# (and a disagreement that started an hour ago still shows).
DEFAULT_WINDOW_S = 3600.0
DEFAULT_TOLERANCE = 0.01  # a relative difference above 1% is flagged


@dataclass(frozen=True)
class CheckedCounter:
    """One counter both sides keep. ``hooks_table``/``hooks_value``: the hooks' rows (a
    record table, ``requests`` or ``block_events``, and the summed expression),
    ``hooks_where`` their filter, timed by
    ``hooks_time``. ``metric``: the engine's series as exposed, ``labels_like`` a filter on
    its labels, ``field`` ``value`` (a counter's increase) or ``sum_value`` (a histogram's
    sum over the interval). ``engine_counts``: what the engine's series counts, in words
    (the hooks' side counts the same)."""

    name: str
    metric: str
    hooks_table: str
    hooks_value: str
    hooks_time: str
    engine_counts: str
    hooks_where: str = "TRUE"
    labels_like: str = "%"
    field: str = "value"


_FINISHED = "arrival_s + coalesce(e2e_latency_s, 0)"
# the store's views with each row's engine, instance and source
STORE_TABLES = {table: WITH_ORIGIN[table] for table in ("requests", "block_events", "metric_intervals")}
COUNTERS: dict[str, tuple[CheckedCounter, ...]] = {
    # vLLM 0.32/0.33 vllm/v1/metrics/loggers.py and its offloading connector's metrics
    "vllm": (
        CheckedCounter("prompt_tokens", "vllm:prompt_tokens_total", "requests",
                       "prompt_tokens", _FINISHED, "prompt tokens of the requests whose prefill ran"),
        CheckedCounter("gpu_hit_tokens", "vllm:prefix_cache_hits_total", "requests",
                       "gpu_hit_tokens", _FINISHED, "prompt tokens found in its GPU prefix cache"),
        CheckedCounter("cpu_promoted_tokens", "vllm:external_prefix_cache_hits_total", "requests",
                       "cpu_promotion_tokens", _FINISHED,
                       "prompt tokens its offloading connector supplied (CPU tier)"),
        CheckedCounter("recomputed_tokens", "vllm:prompt_tokens_by_source_total", "requests",
                       "recomputed_tokens", _FINISHED, "prompt tokens it computed (prefilled)",
                       labels_like='%source="local_compute"%'),
        CheckedCounter("cpu_stored_bytes", "vllm:kv_offload_store_bytes_total",
                       "block_events", "size_bytes", "time_s",
                       "bytes of GPU-to-CPU stores that completed, summed over the workers",
                       "kind = 'store' AND tier_from = 'gpu' AND tier_to = 'cpu'"),
    ),
}


def checked_counter(engine: str, name: str) -> CheckedCounter:
    """The :data:`COUNTERS` entry of ``engine`` called ``name``; ``KeyError`` when none."""
    for counter in COUNTERS.get(engine, ()):
        if counter.name == name:
            return counter
    raise KeyError(f"no cross-checked counter {name!r} for engine {engine!r}")


@dataclass(frozen=True)
class CounterCheck:
    """One counter of one instance over ``window_start_s``..``window_end_s`` (Unix seconds):
    ``hooks_total`` what the hooks recorded, ``engine_total`` what the engine counted."""

    engine: str
    instance: str
    counter: str
    hooks_total: float
    engine_total: float
    window_start_s: float
    window_end_s: float

    @property
    def difference(self) -> float:
        """Hooks minus engine (positive: the hooks saw more)."""
        return self.hooks_total - self.engine_total

    @property
    def ratio(self) -> float:
        """Hooks over engine; 1.0 when both are 0, ``inf`` when only the engine's is 0."""
        if self.engine_total == 0:
            return 1.0 if self.hooks_total == 0 else math.inf
        return self.hooks_total / self.engine_total

    def disagrees(self, tolerance: float = DEFAULT_TOLERANCE) -> bool:
        """Whether the sides differ by more than ``tolerance`` of the larger (0.01: 1%)."""
        return abs(self.difference) > tolerance * max(abs(self.hooks_total), abs(self.engine_total))


def crosscheck(rows: Callable[[str, list], list[dict]], now_s: float,
               settle_s: float = DEFAULT_SETTLE_S, window_s: float = DEFAULT_WINDOW_S,
               tables: Mapping[str, str | None] = STORE_TABLES) -> tuple[CounterCheck, ...]:
    """Every counter of :data:`COUNTERS` for each instance whose hooks and scraped metrics
    are both in the rows ``rows(sql, params)`` reads, over the scrape intervals that lie
    within the ``window_s`` seconds before ``now_s - settle_s``. ``tables`` names the relation of each record table (with origin
    columns); a table named ``None`` is absent, and its counters are not checked."""
    checks = []
    end_s = now_s - settle_s
    start_s = end_s - window_s
    if tables.get("metric_intervals") is None or tables.get("requests") is None:
        return ()
    for engine, counters in sorted(COUNTERS.items()):
        for counter in counters:
            if tables.get(counter.hooks_table) is None:
                continue
            found = rows(_sql(counter, tables), [engine, engine, counter.metric, counter.labels_like,
                                                 start_s, end_s, engine, engine, start_s, end_s,
                                                 engine, engine, start_s])
            checks += [CounterCheck(engine, r["instance"], counter.name, float(r["hooks"]),
                                    float(r["counted"]), r["start_s"], r["end_s"]) for r in found]
    return tuple(sorted(checks, key=lambda c: (c.engine, c.instance, c.counter)))


def _sql(counter: CheckedCounter, tables: Mapping[str, str | None]) -> str:
    # spans: each scrape interval once (a metric's label sets share them); hooks: the rows
    # timed within a span; only instances whose hooks are in the store at all
    intervals, requests, hooked = (tables["metric_intervals"], tables["requests"],
                                   tables[counter.hooks_table])
    return f"""
        WITH series AS (
            SELECT instance, start_s, end_s, {counter.field} AS v FROM {intervals}
            WHERE engine = ? AND source LIKE ? || '-scrape:%' AND metric = ?
              AND labels LIKE ? AND start_s >= ? AND end_s <= ?),
        spans AS (SELECT instance, start_s, end_s, sum(coalesce(v, 0)) AS counted
                  FROM series GROUP BY ALL),
        hooked AS (SELECT s.instance, s.start_s, sum(coalesce({counter.hooks_value}, 0)) AS hooks
                   FROM spans s JOIN {hooked} h ON h.instance = s.instance
                    AND h.engine = ? AND h.source LIKE ? || '-hooks:%'
                    AND {counter.hooks_where}
                    AND {counter.hooks_time} > ? AND {counter.hooks_time} <= ?
                    AND {counter.hooks_time} > s.start_s AND {counter.hooks_time} <= s.end_s
                   GROUP BY ALL)
        SELECT s.instance, sum(s.counted) AS counted, coalesce(sum(h.hooks), 0) AS hooks,
               min(s.start_s) AS start_s, max(s.end_s) AS end_s
        FROM spans s LEFT JOIN hooked h USING (instance, start_s)
        WHERE s.instance IN (SELECT DISTINCT instance FROM {requests}
                             WHERE engine = ? AND source LIKE ? || '-hooks:%'
                               AND arrival_s + coalesce(e2e_latency_s, 0) > ?)
        GROUP BY s.instance"""
