"""Promotion jobs: the block events of one load, read as one job.

An engine loads a request's promoted blocks as one job and records one lookup event per
block, each carrying the job's latency (vLLM's hooks: from the scheduler's ``prepare_load``
to its ``complete_load``; the reference engine: the copy inside the step). So the events of
one source, request, tier and time are one job: its latency counted once, its bytes, blocks
and tokens summed. A fit then tells a fixed wait per job from a per-byte term, and a job of
32 blocks weighs as much as a job of one. :func:`jobs_sql` is the one grouping; the
calibration's reader, the measured per-token costs and the dashboard's load waits use it.
"""

from __future__ import annotations

from dataclasses import dataclass

PROMOTION_KINDS = ("cpu_promotion", "cold_promotion")
RECOMPUTE_KIND = "recompute_miss"
# the tier a job's blocks came from: the event's own, else its kind's
_TIER = ("CASE WHEN CAST(kind AS VARCHAR) = 'recompute_miss' THEN 'recompute' ELSE coalesce("
         "CAST(tier_from AS VARCHAR), CASE CAST(kind AS VARCHAR) WHEN 'cpu_promotion' THEN 'cpu' "
         "ELSE 'cold' END) END")


@dataclass(frozen=True, slots=True)
class PromotionJob:
    """One load: a request's blocks promoted from one tier together.

    ``tier`` is where they came from (``cpu``, ``cold``; ``recompute`` for the recompute
    misses an engine timed, read only when asked for), ``size_bytes`` the blocks' bytes (0:
    the events carried none), ``latency_s`` the job's, ``blocks`` its events, ``tokens`` the
    prompt tokens its events name (``None``: they carry bytes only), ``time_s`` when it was
    recorded, ``request_id`` whose load it was.
    """

    tier: str
    size_bytes: int
    latency_s: float
    blocks: int = 1
    time_s: float | None = None
    request_id: str | None = None
    tokens: int | None = None

    def tokens_at(self, bytes_per_token: float | None) -> float | None:
        """The job's tokens; a job whose events carry bytes only counts its bytes' worth at
        ``bytes_per_token`` (``None``: unknown, and so is the answer)."""
        if self.tokens is not None:
            return float(self.tokens)
        if bytes_per_token and self.size_bytes:
            return self.size_bytes / bytes_per_token
        return None


def jobs_sql(events: str, *, recompute: bool = False, where: str = "") -> str:
    """SQL yielding one row per job over the block-events relation ``events`` (a table, a
    view or a parenthesised query with the events' columns and ``instance``): ``instance``,
    ``source``, ``request_id``, ``kind``, ``tier``, ``time_s``, ``latency_s``, ``blocks``,
    ``size_bytes``, ``tokens``. Promotions only, recompute misses too with ``recompute``;
    events without a latency are no job's. ``where`` adds conditions on the events."""
    kinds = PROMOTION_KINDS + ((RECOMPUTE_KIND,) if recompute else ())
    labels = ", ".join(f"'{kind}'" for kind in kinds)
    extra = f" AND ({where})" if where else ""
    return f"""
        SELECT CAST(instance AS VARCHAR) AS instance, source, request_id,
               CAST(kind AS VARCHAR) AS kind, {_TIER} AS tier, time_s,
               max(latency_s) AS latency_s, count(*) AS blocks,
               coalesce(sum(size_bytes), 0) AS size_bytes, sum(tokens) AS tokens
        FROM {events}
        WHERE latency_s IS NOT NULL AND CAST(kind AS VARCHAR) IN ({labels}){extra}
        GROUP BY ALL"""


def jobs_of(rows) -> list[PromotionJob]:
    """:class:`PromotionJob` values from :func:`jobs_sql`'s rows (dicts), in order."""
    return [PromotionJob(row["tier"], int(row["size_bytes"]), float(row["latency_s"]),
                         int(row["blocks"]), row["time_s"], row["request_id"],
                         None if row["tokens"] is None else int(row["tokens"]))
            for row in rows]


def read_jobs(reader, *, recompute: bool = False) -> tuple[list[PromotionJob], str] | None:
    """The jobs behind a store's or a segment folder's reader (its instance only, when it has
    one) and where they came from; ``None`` for a trace, which has no block events."""
    from kvtier.collector.event_rows import block_event_rows

    found = block_event_rows(reader, jobs_sql("{events}", recompute=recompute)
                             + " ORDER BY time_s, source, request_id, tier")
    if found is None:
        return None
    rows, where = found
    return jobs_of(rows), where
