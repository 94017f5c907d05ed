"""Aggregate queries behind the pages. Each returns a small DataFrame computed in SQL.

Units are in the column names (``*_s``, ``*_ms``, ``*_bytes``); times on chart axes are
``time`` (UTC timestamps of bucket starts).
"""

from __future__ import annotations

import pandas as pd

from kvtier.collector.block_kinds import LOOKUP_OUTCOMES
from kvtier.collector.promotion_jobs import jobs_sql
from kvtier.dashboard.data import SEEN, SERVED, Filters, SegmentData, and_where, bucket_width_s, empty_frame

# Lookup outcomes in order of quality (best first), for stacking and colours.
OUTCOME_ORDER = ("gpu_hit", "cpu_promotion", "cold_promotion", "recompute_miss")
_LOOKUPS_SQL = ", ".join(f"'{o.label}'" for o in sorted(LOOKUP_OUTCOMES))
_TOKEN_COLUMNS = {"gpu_hit": "gpu_hit_tokens", "cpu_promotion": "cpu_promotion_tokens",
                  "cold_promotion": "cold_promotion_tokens", "recompute_miss": "recomputed_tokens"}
# Reuse-count classes for the shared-prefix histogram: (label, lowest count in class).
REUSE_CLASSES = (("1 (never reused)", 1), ("2", 2), ("3-5", 3), ("6-10", 6), ("11-100", 11), (">100", 101))


BASES = ("tokens", "blocks")


def hit_quality(data: SegmentData, filters: Filters, span: tuple[float | None, float | None],
                basis: str = "tokens") -> tuple[pd.DataFrame, str]:
    """Lookup outcomes per time bucket and tier configuration.

    Columns ``time``, ``tier_config``, ``outcome``, ``amount``, ``share``. With ``basis``
    ``"tokens"``: prompt tokens each tier served and the tokens recomputed, from the request
    records' tier split (what the engine counts, vLLM's prompt_tokens_cached_by_source),
    falling back to block events when no record has a split; with ``"blocks"``: lookup
    events. The second value names the unit (``"tokens"``, ``"blocks"``, or ``""`` when
    there is no data). Events are no share of work: a block event may stand for any number
    of tokens, and a prompt's tail past its last full block has none.
    """
    if basis not in BASES:
        raise ValueError(f"basis must be one of {', '.join(BASES)}, got {basis!r}")
    lo = filters.start_s if filters.start_s is not None else span[0]
    hi = filters.end_s if filters.end_s is not None else span[1]
    width = bucket_width_s(lo, hi)
    if basis == "tokens" and data.has_requests:
        frame = _shares(data, *_token_outcomes(data, filters, width))
        if not frame.empty or not data.has_events:
            return _ranked(frame), "tokens"
    if data.has_events:
        return _ranked(_shares(data, *_event_outcomes(data, filters, width))), "blocks"
    return empty_frame("time", "tier_config", "outcome", "amount", "share"), ""


def _shares(data: SegmentData, sql: str, params: list) -> pd.DataFrame:
    return data.df(f"""SELECT to_timestamp(bucket_s) AS time, tier_config, outcome, amount,
            amount / sum(amount) OVER (PARTITION BY bucket_s, tier_config) AS share
        FROM ({sql}) ORDER BY time, tier_config, outcome""", params)


def _event_outcomes(data: SegmentData, filters: Filters, width: int) -> tuple[str, list]:
    """Lookup events per bucket, configuration and outcome (``bucket_s``, ``tier_config``,
    ``outcome``, ``amount``)."""
    where, params = data.where(filters, "raw_events")
    # Count per request first, then attach each request's configuration: one join probe
    # per (bucket, request, outcome) instead of one per event.
    # Seconds, not buckets, keep a request id that recurs (a replay per configuration)
    # apart from its earlier runs.
    per_request = f"""SELECT instance, request_id, kind AS outcome, min(time_s) AS time_s, count(*) AS n
        FROM raw_events {and_where(where, f"kind IN ({_LOOKUPS_SQL})")}
        GROUP BY instance, request_id, kind, floor(time_s)"""
    config_where, config_params = _config_filter(filters)
    return (f"""SELECT floor(time_s / {width}) * {width} AS bucket_s, tier_config, outcome,
            sum(n)::DOUBLE AS amount
        FROM ({data.with_config(f"({per_request})")}) {config_where} GROUP BY ALL""",
            params + config_params)


def _token_outcomes(data: SegmentData, filters: Filters, width: int) -> tuple[str, list]:
    """The same from request records, in prompt tokens served by each tier."""
    relation, params = data.requests(filters, SERVED)
    pairs = ", ".join(f"{{'outcome': '{o}', 'amount': sum({c})}}" for o, c in _TOKEN_COLUMNS.items())
    return (f"""SELECT bucket_s, tier_config, v.outcome, v.amount::DOUBLE AS amount FROM (
            SELECT floor(arrival_s / {width}) * {width} AS bucket_s, tier_config_id AS tier_config,
                   [{pairs}] AS pairs
            FROM {relation} GROUP BY ALL), unnest(pairs) AS u(v)
        WHERE v.amount > 0""", params)  # like events: an outcome that never happened has no row


def _config_filter(filters: Filters) -> tuple[str, list]:
    if not filters.tier_configs:
        return "", []
    return "WHERE list_contains(?::VARCHAR[], tier_config)", [list(filters.tier_configs)]


def outcome_totals(frame: pd.DataFrame) -> pd.DataFrame:
    """Totals and shares per tier configuration and outcome, from ``hit_quality``'s frame."""
    if frame.empty:
        return empty_frame("tier_config", "outcome", "amount", "share")
    totals = frame.groupby(["tier_config", "outcome"], as_index=False)["amount"].sum()
    totals["share"] = totals["amount"] / totals.groupby("tier_config")["amount"].transform("sum")
    return _ranked(totals)


def headline(totals: pd.DataFrame, configs: list[str] | None = None) -> pd.DataFrame:
    """The overview's headline from ``outcome_totals``' frame, per tier configuration (a
    figure over several would describe no deployment): one row per configuration and outcome
    in ``OUTCOME_ORDER`` (``tier_config``, ``outcome``, ``amount``, ``share``; an outcome that
    never happened has amount and share 0), configurations in ``configs``' order (default:
    as they come)."""
    if configs is None:
        configs = list(dict.fromkeys(totals["tier_config"])) if len(totals) else []
    rows = []
    for config in configs:
        mine = totals[totals["tier_config"] == config]
        amounts = mine.groupby("outcome")["amount"].sum()
        whole = float(amounts.sum())
        rows += [{"tier_config": config, "outcome": o, "amount": float(amounts.get(o, 0.0)),
                  "share": float(amounts.get(o, 0.0)) / whole if whole else 0.0}
                 for o in OUTCOME_ORDER]
    return pd.DataFrame(rows, columns=["tier_config", "outcome", "amount", "share"])


def _ranked(frame: pd.DataFrame) -> pd.DataFrame:
    """Add ``outcome_rank`` (best outcome first) for stacking order."""
    frame["outcome_rank"] = frame["outcome"].map({o: i for i, o in enumerate(OUTCOME_ORDER)})
    return frame


_QUANTILE_ROWS = """unnest([{'quantile': 'p50', 'latency_s': qs[1]}, {'quantile': 'p95', 'latency_s': qs[2]},
                           {'quantile': 'p99', 'latency_s': qs[3]}]) AS u(q)"""
# vLLM's worker-side copy of loads: seconds summed over workers and jobs, and one size
# observation per worker-side job (vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py).
COPY_SECONDS, COPY_JOBS, COPY_BYTES = ("vllm:kv_offload_load_time_total", "vllm:kv_offload_load_size",
                                       "vllm:kv_offload_load_bytes_total")


def _load_jobs(data: SegmentData, filters: Filters, recompute: bool) -> tuple[str, list]:
    """One row per load job (``source_tier``, ``kind``, ``latency_s``, ``blocks``,
    ``size_bytes``), grouped as :mod:`kvtier.collector.promotion_jobs` groups them: a job
    counts once however many blocks it moved; recompute misses too with ``recompute``."""
    view = data.events_view(filters)
    where, params = data.where(filters, view)
    jobs = jobs_sql(f"(SELECT * FROM {view} {where})", recompute=recompute)
    return f"SELECT tier AS source_tier, kind, latency_s, blocks, size_bytes FROM ({jobs})", params


def load_wait(data: SegmentData, filters: Filters) -> pd.DataFrame:
    """How long a load held its request, per load job: p50/p95/p99 (ms) of the time from the
    scheduler's ``prepare_load`` to its ``complete_load`` (queueing and the transfer), by source
    tier and kind, long form: ``source_tier``, ``kind``, ``quantile``, ``latency_ms``,
    ``jobs``, ``blocks``, ``mean_ms``. Recompute misses are included (their prefill share)."""
    columns = ("source_tier", "kind", "quantile", "latency_ms", "jobs", "blocks", "mean_ms")
    if not data.has_events:
        return empty_frame(*columns)
    jobs, params = _load_jobs(data, filters, recompute=True)
    return data.df(f"""SELECT source_tier, kind, q.quantile, q.latency_s * 1000 AS latency_ms,
            jobs, blocks, mean_ms
        FROM (SELECT source_tier, kind, count(*) AS jobs, sum(blocks) AS blocks,
                     avg(latency_s) * 1000 AS mean_ms,
                     quantile_cont(latency_s, [0.5, 0.95, 0.99]) AS qs
              FROM ({jobs}) GROUP BY ALL), {_QUANTILE_ROWS}
        ORDER BY source_tier, q.quantile""", params)


def copy_time(data: SegmentData, filters: Filters) -> pd.DataFrame:
    """The engine's own copy time per load job, where it reports one: vLLM's worker-side
    transfer time (``kv_offload_load_time``) over its load jobs (``kv_offload_load_size``
    observations), from the scraped metric intervals, per engine and instance: ``engine``,
    ``instance``, ``jobs``, ``copy_s``, ``copied_bytes``, ``mean_copy_ms``. A mean, not
    percentiles: the engine exports sums. Empty when a tier configuration is selected (a
    scrape does not say which configuration's requests it counted)."""
    columns = ("engine", "instance", "jobs", "copy_s", "copied_bytes", "mean_copy_ms")
    if not data.has_metrics or filters.tier_configs:
        return empty_frame(*columns)
    where, params = data.where(filters, "metric_intervals")
    return data.df(f"""SELECT engine, instance, jobs, copy_s, copied_bytes,
            copy_s / jobs * 1000 AS mean_copy_ms
        FROM (SELECT engine, instance, sum(value) FILTER (metric = '{COPY_JOBS}') AS jobs,
                     sum(value) FILTER (metric = '{COPY_SECONDS}') AS copy_s,
                     sum(value) FILTER (metric = '{COPY_BYTES}') AS copied_bytes
              FROM metric_intervals {where} GROUP BY ALL)
        WHERE jobs > 0 AND copy_s IS NOT NULL ORDER BY engine, instance""", params)


def size_latency(data: SegmentData, filters: Filters) -> pd.DataFrame:
    """Load wait against the bytes a job moved: ``source_tier``, ``job_bytes`` (power-of-two
    bucket), ``jobs``, ``p50_ms``, ``bandwidth_bytes_per_s`` (bytes over wait, per job). Shows
    whether bigger loads still fit the transfer budget a request can afford."""
    if not data.has_events:
        return empty_frame("source_tier", "job_bytes", "jobs", "p50_ms", "bandwidth_bytes_per_s")
    jobs, params = _load_jobs(data, filters, recompute=False)
    return data.df(f"""SELECT source_tier, pow(2, floor(log2(size_bytes))) AS job_bytes,
            count(*) AS jobs, quantile_cont(latency_s, 0.5) * 1000 AS p50_ms,
            sum(size_bytes) / nullif(sum(latency_s), 0) AS bandwidth_bytes_per_s
        FROM ({jobs}) WHERE size_bytes > 0 GROUP BY ALL ORDER BY source_tier, job_bytes""", params)


def request_latency(data: SegmentData, filters: Filters) -> pd.DataFrame:
    """TTFT and ITL p50/p95/p99 (ms) per tier configuration, long form: ``tier_config``,
    ``metric`` (``ttft``/``itl``), ``quantile``, ``latency_ms``, ``requests``."""
    if not data.has_requests:
        return empty_frame("tier_config", "metric", "quantile", "latency_ms", "requests")
    relation, params = data.requests(filters, SEEN)
    parts = []
    for metric, column in (("ttft", "ttft_s"), ("itl", "itl_s")):
        parts.append(f"""SELECT tier_config_id AS tier_config, '{metric}' AS metric, count({column}) AS requests,
                min(arrival_s) AS first_s, quantile_cont({column}, [0.5, 0.95, 0.99]) AS qs
            FROM {relation} WHERE {column} IS NOT NULL GROUP BY ALL""")
    return data.df(f"""SELECT tier_config, metric, q.quantile, q.v * 1000 AS latency_ms, requests
        FROM ({" UNION ALL ".join(parts)}),
             unnest([{{'quantile': 'p50', 'v': qs[1]}}, {{'quantile': 'p95', 'v': qs[2]}},
                     {{'quantile': 'p99', 'v': qs[3]}}]) AS u(q)
        ORDER BY first_s, metric, q.quantile""", params + params)


def latency_over_time(data: SegmentData, filters: Filters, span: tuple[float | None, float | None]
                      ) -> pd.DataFrame:
    """p99 TTFT and ITL (ms) per time bucket and tier configuration, the series the rollback
    rule watches: ``time``, ``tier_config``, ``metric``, ``p99_ms``, ``requests``."""
    if not data.has_requests:
        return empty_frame("time", "tier_config", "metric", "p99_ms", "requests")
    lo = filters.start_s if filters.start_s is not None else span[0]
    hi = filters.end_s if filters.end_s is not None else span[1]
    width = bucket_width_s(lo, hi)
    relation, params = data.requests(filters, SEEN)
    parts = [f"""SELECT floor(arrival_s / {width}) * {width} AS bucket_s, tier_config_id AS tier_config,
                '{metric}' AS metric, quantile_cont({column}, 0.99) * 1000 AS p99_ms, count({column}) AS requests
            FROM {relation} WHERE {column} IS NOT NULL GROUP BY ALL"""
             for metric, column in (("ttft", "ttft_s"), ("itl", "itl_s"))]
    return data.df(f"""SELECT to_timestamp(bucket_s) AS time, tier_config, metric, p99_ms, requests
        FROM ({" UNION ALL ".join(parts)}) ORDER BY time, tier_config, metric""", params + params)


def tier_moves(data: SegmentData, filters: Filters) -> pd.DataFrame:
    """The guardrail's moves in the selection, oldest first: ``time``, ``instance``,
    ``actor``, ``action``, ``paused`` (direction and tier), ``mode``, ``reason``, the
    ``ttft_p99_ms`` it reacted to against ``budget_ms``, and ``tier_config`` after it."""
    columns = ("time", "instance", "actor", "action", "paused", "mode", "reason", "ttft_p99_ms",
               "budget_ms", "tier_config")
    if not data.has_moves:
        return empty_frame(*columns)
    where, params = data.where(filters, "tier_moves")
    return data.df(f"""SELECT to_timestamp(time_s) AS time, instance, actor, action,
            direction || ' from ' || tier AS paused, mode, reason, ttft_p99_s * 1000 AS ttft_p99_ms,
            budget_s * 1000 AS budget_ms, tier_config_id AS tier_config
        FROM tier_moves {where} ORDER BY time_s""", params)
