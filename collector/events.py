"""The event schema: the one place that defines what kvtier records.

Standard library only. Every other part (probes, the store, the simulator, the dashboard)
imports these names; the DuckDB tables are derived from the dataclasses below
(see ``collector/ddl.py``) and a test keeps the two in step.

Five record types:

* :class:`BlockEvent` — one thing that happened to one KV block: a lookup outcome
  (GPU hit, CPU promotion, cold promotion, recompute miss) or a movement/bookkeeping
  event (store, evict, drop, priority update).
* :class:`RequestRecord` — one request: arrival, sizes, how many prompt tokens each tier
  served and how many were recomputed, latency, and the tier configuration that was active.
* :class:`MetricInterval` — what one series of an engine's Prometheus metrics did between
  two scrapes (a counter's increase, a gauge's value, a histogram's observations).
* :class:`StepRecord` — one scheduler step of an engine: what it scheduled (prefill and
  decode), what waited, what moved between tiers, and how long the step took.
* :class:`kvtier.collector.moves.TierMove` — one pause or resume of a tier's loads or stores
  in an engine: what kvtier's guardrail decided, what an operator asked, what the engine
  applied (its own module, the same rules).

Units are in the field names: ``*_s`` seconds (wall-clock times are Unix epoch seconds),
``*_bytes`` bytes, ``*_tokens`` tokens. Absent values are ``None``, never sentinels.

Block hashes are unsigned 64-bit integers. Engines that hash to bytes are folded with
:func:`kvtier.collector.block_kinds.block_hash_from_bytes` (the same rule vLLM applies to its KV events: the last eight
bytes of the digest, big-endian), so GPU, CPU and file-tier events correlate by hash.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterator, Protocol

from kvtier.collector.block_kinds import UINT64_MAX, Outcome, Tier
from kvtier.collector.finish import END_TURN_REASONS, FINISH_CLASSES, finish_class  # noqa: F401

# RequestRecord.finish_status values: how a request ended.
FINISH_STATUSES = ("stopped", "length", "aborted", "error")
# Engines whose request records are a client's view of requests an engine also records
# (kvtier probe load): no step records, latencies measured at the client.
CLIENT_ENGINES = frozenset({"load-probe"})
PRIORITY_MIN = 0
PRIORITY_MAX = 100
# RequestRecord.fallback_reason values: why prompt tokens a tier held were recomputed instead
# of loaded (the tier's loads were paused; the load's expected wait exceeded the recompute).
FALLBACK_REASONS = ("paused", "queue")
# MetricInterval.kind values: what ``value`` is.
METRIC_KINDS = ("counter", "gauge", "histogram")
# Kinds whose value counts something (a counter's increase, a histogram's observations), so
# is never negative; every kind's value is finite. The reasons are the same for records,
# columns and a scraped page's samples.
COUNTING_METRIC_KINDS = ("counter", "histogram")
NEGATIVE_METRIC_VALUE = {kind: f"negative {kind} value" for kind in COUNTING_METRIC_KINDS}
NON_FINITE_METRIC_VALUE = "value not finite"
NON_FINITE_METRIC_SUM = "sum_value not finite"


def _sql(type_name: str, **extra) -> dict:
    # Column type override for the DDL derivation (collector/ddl.py).
    return {"sql": type_name, **extra}


@dataclass(frozen=True, slots=True)
class Origin:
    """Who produced a batch of records: the engine kind, the serving instance, and the
    stream (``source``) whose ``sequence`` numbers make ingest idempotent."""

    engine: str
    instance: str
    source: str

    def __post_init__(self) -> None:
        for name in ("engine", "instance", "source"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Origin.{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True, slots=True)
class BlockEvent:
    """One event on one KV block.

    ``tier_from``/``tier_to`` describe the movement: a CPU promotion is CPU→GPU, a cold
    promotion COLD→GPU (staged through CPU), a store GPU→CPU or CPU→COLD, an evict or drop
    names the tier the block left (``tier_to`` is ``None``), a GPU hit has ``tier_to`` GPU
    and no ``tier_from``. ``latency_s`` is the time the operation put on the request's path
    (promotion transfer, recompute prefill share) or took in the background (store).
    """

    time_s: float
    kind: Outcome
    block_hash: int = field(metadata=_sql("UBIGINT"))
    request_id: str | None = None
    parent_hash: int | None = field(default=None, metadata=_sql("UBIGINT"))
    position: int | None = field(default=None, metadata=_sql("INTEGER"))
    tokens: int | None = field(default=None, metadata=_sql("INTEGER"))
    size_bytes: int | None = None
    tier_from: Tier | None = None
    tier_to: Tier | None = None
    priority: int | None = field(default=None, metadata=_sql("SMALLINT"))
    latency_s: float | None = None

    def __post_init__(self) -> None:
        validate_block_event(self)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request, as measured by an engine probe or read from a trace.

    ``block_hashes`` are the prompt's prefix-chained block ids in order, each covering
    ``block_size_tokens`` tokens (the last block may be partial). Token counts per tier
    are prompt tokens; ``recomputed_tokens`` were prefilled because no tier had them.
    ``itl_s`` is the mean inter-token latency of the response. ``tier_config_id`` names the
    tier configuration that was active, so phases of a rollout can be compared.
    ``session_id``/``request_type``/``turn``/``parent_request_id`` come from traces that have
    them (Bailian, WEKA) or from what a client or gateway sent with the request; ``None``
    elsewhere.

    How the request ended: ``finish_status`` is one of :data:`FINISH_STATUSES` (``stopped``: a
    stop condition such as end of sequence, a stop token or string, or a trace's end of turn /
    tool call; ``length``: the output limit; ``aborted``: cancelled before either; ``error``);
    ``stop_reason`` says which stop condition, as the source names it (a stop string, a stop
    token id in decimal, a trace's ``end_turn``/``tool_use``). ``model`` is the served model.

    ``request_id`` is the engine's own id; ``client_request_id`` the id the client saw in the
    response, where the engine names requests differently (vLLM adds a random suffix to
    each), else ``None``.

    ``handoff_s``: seconds from arrival until the engine's scheduler held the request (vLLM:
    the frontend's tokenising and hand-off to the engine core), where the probe sees it.

    ``fallback_tokens``: prompt tokens a tier held that were recomputed instead, and
    ``fallback_reason`` why (:data:`FALLBACK_REASONS`); they are part of ``recomputed_tokens``.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int = field(metadata=_sql("INTEGER"))
    output_tokens: int | None = field(default=None, metadata=_sql("INTEGER"))
    block_hashes: tuple[int, ...] = field(default=(), metadata=_sql("UBIGINT[]"))
    block_size_tokens: int | None = field(default=None, metadata=_sql("INTEGER"))
    gpu_hit_tokens: int | None = None
    cpu_promotion_tokens: int | None = None
    cold_promotion_tokens: int | None = None
    recomputed_tokens: int | None = None
    ttft_s: float | None = None
    itl_s: float | None = None
    e2e_latency_s: float | None = None
    tier_config_id: str | None = None
    session_id: str | None = None
    parent_request_id: str | None = None
    request_type: str | None = None
    turn: int | None = field(default=None, metadata=_sql("INTEGER"))
    finish_status: str | None = field(default=None, metadata={"choices": FINISH_STATUSES})
    stop_reason: str | None = None
    model: str | None = None
    client_request_id: str | None = None
    handoff_s: float | None = None
    fallback_reason: str | None = field(default=None, metadata={"choices": FALLBACK_REASONS})
    fallback_tokens: int | None = field(default=None, metadata=_sql("INTEGER"))

    def __post_init__(self) -> None:
        validate_request(self)


@dataclass(frozen=True, slots=True)
class MetricInterval:
    """One series of an engine's Prometheus metrics over one scrape interval, ``start_s`` to
    ``end_s`` (Unix seconds; the first scrape is a baseline, so intervals start at the
    second). ``metric`` is the sample name as exposed (``vllm:prefix_cache_hits_total``;
    a histogram without ``_bucket``), ``labels`` its labels as Prometheus writes them
    (``engine="0",model_name="m"``, sorted). ``kind`` is one of :data:`METRIC_KINDS`:
    ``value`` is a counter's increase over the interval (a reset counts from 0), a gauge's
    value at ``end_s``, or the number of a histogram's observations in the interval, whose
    sum is ``sum_value``. ``reset`` says the series restarted during the interval.
    """

    start_s: float
    end_s: float
    metric: str
    kind: str
    value: float
    labels: str = ""
    sum_value: float | None = None
    reset: int | None = field(default=None, metadata=_sql("SMALLINT"))

    def __post_init__(self) -> None:
        validate_metric_interval(self)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One scheduler step of an engine, as its scheduler saw it.

    ``time_s`` is when the step was scheduled (Unix seconds) and ``duration_s`` how long it
    ran until the next step could be scheduled (``None`` when the engine cannot tell; the next
    record's ``time_s`` then bounds it). ``step`` numbers the engine's steps from its start.

    Scheduled work: ``prefill_tokens`` prompt tokens computed in this step (new, not served by
    any tier; a chunked prefill's chunk), over ``prefill_requests`` requests, whose context
    before the chunk adds up to ``prefill_context_tokens`` (attention grows with it);
    ``cached_tokens`` prompt tokens that requests starting this step found cached (GPU hits
    and promotions together); ``decode_requests`` requests generating one token each, whose
    contexts add up to ``decode_context_tokens``. Queue: ``running_requests`` and
    ``waiting_requests`` after scheduling, ``preempted_requests`` sent back in this step.
    Tier traffic scheduled in this step: ``loaded_bytes`` promoted into the GPU tier,
    ``stored_bytes`` offloaded out of it.
    """

    time_s: float
    step: int = field(metadata=_sql("BIGINT"))
    duration_s: float | None = None
    prefill_tokens: int = field(default=0, metadata=_sql("INTEGER"))
    prefill_requests: int = field(default=0, metadata=_sql("INTEGER"))
    prefill_context_tokens: int = field(default=0, metadata=_sql("BIGINT"))
    cached_tokens: int = field(default=0, metadata=_sql("INTEGER"))
    decode_requests: int = field(default=0, metadata=_sql("INTEGER"))
    decode_context_tokens: int = field(default=0, metadata=_sql("BIGINT"))
    running_requests: int = field(default=0, metadata=_sql("INTEGER"))
    waiting_requests: int = field(default=0, metadata=_sql("INTEGER"))
    preempted_requests: int = field(default=0, metadata=_sql("INTEGER"))
    loaded_bytes: int = 0
    stored_bytes: int = 0

    def __post_init__(self) -> None:
        validate_step(self)


# ---- validation rules, shared by the dataclasses and the store's columnar checks ----

NON_NEGATIVE_BLOCK_FIELDS = ("time_s", "position", "tokens", "size_bytes", "latency_s")
NON_NEGATIVE_REQUEST_FIELDS = (
    "arrival_s", "prompt_tokens", "output_tokens", "block_size_tokens", "gpu_hit_tokens",
    "cpu_promotion_tokens", "cold_promotion_tokens", "recomputed_tokens",
    "ttft_s", "itl_s", "e2e_latency_s", "handoff_s", "fallback_tokens",
)


MAX_TIME_S = 4_102_444_800.0  # 2100-01-01 UTC: times are Unix seconds or seconds into a trace
MAX_DURATION_S = 7 * 86_400.0  # a week: a longer latency is a broken clock or unit, not a wait
# Upper bounds by field name, for every record type that has the field; above one (or
# infinite) the value is refused. Lower bounds are the NON_NEGATIVE_* tuples.
UPPER_BOUNDS = {
    "time_s": MAX_TIME_S, "arrival_s": MAX_TIME_S, "start_s": MAX_TIME_S, "end_s": MAX_TIME_S,
    "latency_s": MAX_DURATION_S, "ttft_s": MAX_DURATION_S, "itl_s": MAX_DURATION_S,
    "e2e_latency_s": MAX_DURATION_S, "duration_s": MAX_DURATION_S, "handoff_s": MAX_DURATION_S,
}
# Prompt tokens a tier served: together at most the prompt (recomputed tokens are the rest).
SERVED_TOKEN_FIELDS = ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens")
SERVED_OVER_PROMPT = "served tokens (gpu_hit + cpu_promotion + cold_promotion) exceed prompt_tokens"


def upper_bounds(record_type: type) -> tuple[tuple[str, float], ...]:
    """The bounded fields of ``record_type`` and their largest allowed values."""
    bounds = _BOUNDS_BY_TYPE.get(record_type)
    if bounds is None:
        names = {f.name for f in dataclasses.fields(record_type)}
        bounds = _BOUNDS_BY_TYPE[record_type] = tuple(
            (name, limit) for name, limit in UPPER_BOUNDS.items() if name in names)
    return bounds


_BOUNDS_BY_TYPE: dict[type, tuple[tuple[str, float], ...]] = {}


def validate_block_event(event: BlockEvent) -> None:
    """Raise ``ValueError`` naming the first field that breaks the schema's rules."""
    if not isinstance(event.kind, Outcome):
        raise ValueError(f"kind must be an Outcome, got {event.kind!r}")
    for name in ("tier_from", "tier_to"):
        value = getattr(event, name)
        if value is not None and not isinstance(value, Tier):
            raise ValueError(f"{name} must be a Tier or None, got {value!r}")
    if not isinstance(event.block_hash, int) or not 0 <= event.block_hash <= UINT64_MAX:
        raise ValueError(f"block_hash must be an unsigned 64-bit int, got {event.block_hash!r}")
    if event.parent_hash is not None and not 0 <= event.parent_hash <= UINT64_MAX:
        raise ValueError(f"parent_hash must be an unsigned 64-bit int, got {event.parent_hash!r}")
    validate_fields(event, NON_NEGATIVE_BLOCK_FIELDS)
    if event.priority is not None and not PRIORITY_MIN <= event.priority <= PRIORITY_MAX:
        raise ValueError(f"priority must be in {PRIORITY_MIN}..{PRIORITY_MAX}, got {event.priority}")


def validate_request(record: RequestRecord) -> None:
    """Raise ``ValueError`` naming the first field that breaks the schema's rules."""
    if not isinstance(record.request_id, str) or not record.request_id:
        raise ValueError(f"request_id must be a non-empty string, got {record.request_id!r}")
    validate_fields(record, NON_NEGATIVE_REQUEST_FIELDS)
    served = sum(getattr(record, name) or 0 for name in SERVED_TOKEN_FIELDS)
    if served > record.prompt_tokens:
        raise ValueError(f"{SERVED_OVER_PROMPT}: {served} > {record.prompt_tokens}")
    if not isinstance(record.block_hashes, tuple):
        raise ValueError("block_hashes must be a tuple of ints")


def validate_metric_interval(record: MetricInterval) -> None:
    """Raise ``ValueError`` naming the first field that breaks the schema's rules."""
    if not isinstance(record.metric, str) or not record.metric:
        raise ValueError(f"metric must be a non-empty string, got {record.metric!r}")
    if record.kind not in METRIC_KINDS:
        raise ValueError(f"kind must be one of {', '.join(METRIC_KINDS)}, got {record.kind!r}")
    if not record.end_s >= record.start_s:
        raise ValueError(f"end_s {record.end_s!r} is before start_s {record.start_s!r}")
    _bounded(record)
    for name in ("value", "sum_value"):
        if getattr(record, name) is not None:
            _number(record, name, getattr(record, name))
    problem = metric_value_problem(record.kind, record.value, record.sum_value)
    if problem is not None:
        raise ValueError(f"{problem}, got value={record.value!r}, sum_value={record.sum_value!r}")


def metric_value_problem(kind: str, value: float, sum_value: float | None = None) -> str | None:
    """The rule a metric's value breaks, as its reason, or ``None``: every value and sum is
    finite, and a counter's or a histogram's count is never negative. One rule for a
    ``MetricInterval``, its column and a scraped page's cumulative sample alike."""
    if not math.isfinite(value):
        return NON_FINITE_METRIC_VALUE
    if value < 0 and kind in NEGATIVE_METRIC_VALUE:
        return NEGATIVE_METRIC_VALUE[kind]
    if sum_value is not None and not math.isfinite(sum_value):
        return NON_FINITE_METRIC_SUM
    return None


NON_NEGATIVE_STEP_FIELDS = (
    "step", "duration_s", "prefill_tokens", "prefill_requests", "prefill_context_tokens",
    "cached_tokens", "decode_requests", "decode_context_tokens", "running_requests",
    "waiting_requests", "preempted_requests", "loaded_bytes", "stored_bytes",
)


def validate_step(record: StepRecord) -> None:
    """Raise ``ValueError`` naming the first field that breaks the schema's rules."""
    if not isinstance(record.time_s, (int, float)) or not math.isfinite(record.time_s):
        raise ValueError(f"time_s must be a finite number of seconds, got {record.time_s!r}")
    validate_fields(record, NON_NEGATIVE_STEP_FIELDS)
    if record.duration_s is not None and not math.isfinite(record.duration_s):
        raise ValueError(f"duration_s must be finite, got {record.duration_s!r}")
    if record.prefill_tokens and not record.prefill_requests:
        raise ValueError(f"prefill_tokens {record.prefill_tokens} over no prefill_requests")


def validate_fields(record, non_negative: tuple[str, ...]) -> None:
    """The rules every record type shares (``non_negative`` fields, bounds, choices)."""
    _non_negative(record, non_negative)
    _bounded(record)
    _chosen(record)


def _chosen(record) -> None:
    for f in dataclasses.fields(record):  # a field's "choices": the values it may take
        value, allowed = getattr(record, f.name), f.metadata.get("choices")
        if allowed is not None and value is not None and value not in allowed:
            raise ValueError(f"{f.name} must be one of {', '.join(allowed)}, got {value!r}")


def _bounded(record) -> None:
    for name, limit in upper_bounds(type(record)):
        value = getattr(record, name)
        if value is not None and _number(record, name, value) > limit:  # also rejects +inf
            raise ValueError(f"{name} above {limit:g}, got {value!r}")


def _number(record, name: str, value):
    """``value`` if it is a number (numpy's too); ``ValueError`` naming the field otherwise."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise ValueError(f"{type(record).__name__}.{name} must be a number, got {value!r}")
    return value


def _non_negative(record, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(record, name)
        if value is not None and not _number(record, name, value) >= 0:  # also rejects NaN
            raise ValueError(f"{name} must be >= 0, got {value!r}")


# ---- introspection used to derive tables and columnar buffers ----

def schema_fields(record_type: type) -> tuple[dataclasses.Field, ...]:
    """The fields of ``BlockEvent``, ``RequestRecord``, ``MetricInterval`` or ``StepRecord``, in
    column order."""
    return dataclasses.fields(record_type)


class TraceReader(Protocol):
    """Anything that yields request records in arrival order.

    The store is one reader; the public trace formats (Mooncake, WEKA, Bailian) are others.
    Implementations must yield ``RequestRecord`` values sorted by ``arrival_s`` (ties in
    source order) and may be iterated more than once.
    """

    def requests(self) -> Iterator[RequestRecord]: ...

