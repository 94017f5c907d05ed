"""OpenTelemetry export (OTLP over HTTP/protobuf): the same metrics, and one span per request.

Endpoint, headers and compression come from the standard ``OTEL_EXPORTER_OTLP_*``
environment variables, read by the OpenTelemetry SDK's own exporters.

Metrics are the ``MetricsState`` aggregates (cumulative), converted to the SDK's data model
and handed to ``OTLPMetricExporter`` on a timer, so OTLP and Prometheus report identical
numbers. Spans follow the OpenTelemetry GenAI conventions where they apply
(``gen_ai.operation.name``, ``gen_ai.usage.*``, ``gen_ai.response.time_to_first_chunk``);
kvtier's own attributes are under ``kvtier.*``. A request span has a child span per tier
promotion (its transfer time) and one for the recompute of its missed blocks, when those
block events arrive in the same batch as the request record.
"""

from __future__ import annotations

import logging
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from kvtier.collector.batch import EventBatch
from kvtier.collector.exports.aggregate import HistogramState, MetricsSnapshot, MetricsState
from kvtier.collector.periodic import Periodic

log = logging.getLogger(__name__)
SCOPE = "kvtier.collector"
MAX_PROMOTION_SPANS = 64  # per request; the rest are counted in kvtier.promotions.not_traced
_NS = 1_000_000_000


def metrics_data(snap: MetricsSnapshot, resource=None):
    """The snapshot in the SDK's metrics data model (cumulative temporality)."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    start, now = int(snap.start_time_s * _NS), int(snap.time_s * _NS)
    cumulative = AggregationTemporality.CUMULATIVE

    def counter(name, unit, description, values, names):
        points = [NumberDataPoint(dict(zip(names, key)), start, now, int(value)) for key, value in values.items()]
        return Metric(name, description, unit, Sum(points, cumulative, True))

    def histogram(name, description, states: dict[tuple, HistogramState], names):
        points = [HistogramDataPoint(dict(zip(names, key)), start, now, h.count, h.sum_s, [int(c) for c in h.counts],
                                     list(h.bounds_s), h.min_s, h.max_s) for key, h in states.items()]
        return Metric(name, description, "s", Histogram(points, cumulative))

    block = ("kind", "tier", "engine", "engine_instance", "source")
    config = ("tier_config", "engine", "engine_instance")
    metrics = [
        counter("kvtier.block.events", "{event}", "Block events by outcome kind and tier", snap.block_events, block),
        counter("kvtier.block.tokens", "{token}", "Tokens covered by block events", snap.block_tokens, block),
        counter("kvtier.block.events.reported", "{event}", "Block events as each source reported them",
                snap.block_events_reported, block),
        counter("kvtier.recomputed.tokens", "{token}", "Prompt tokens recomputed", snap.recomputed_tokens,
                ("engine", "engine_instance")),
        counter("kvtier.requests", "{request}", "Requests by tier configuration", snap.requests, config),
        counter("kvtier.rejected.rows", "{row}", "Malformed rows left out at ingest", snap.rejected_rows, ("reason",)),
        histogram("kvtier.promotion.duration", "Promotion latency by source tier", snap.promotion_s,
                  ("tier_from", "engine", "engine_instance")),
        histogram("kvtier.request.time_to_first_token", "Time to first token", snap.ttft_s, config),
        histogram("kvtier.request.inter_token_latency", "Mean inter-token latency", snap.itl_s, config),
    ]
    scope = ScopeMetrics(InstrumentationScope(SCOPE), [m for m in metrics if m.data.data_points], "")
    return MetricsData([ResourceMetrics(resource or Resource.create({"service.name": "kvtier"}), [scope], "")])


class OtlpMetricsPusher:
    """Sends the aggregates every ``interval_s`` seconds (and once more on ``stop``)."""

    def __init__(self, state: MetricsState, exporter=None, *, interval_s: float = 10.0):
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            exporter = OTLPMetricExporter()
        self.state = state
        self.exporter = exporter
        self._loop = Periodic(self.push, interval_s, "kvtier-otlp-metrics")

    def push(self) -> bool:
        """Export once; True when the receiver accepted it."""
        from opentelemetry.sdk.metrics.export import MetricExportResult

        try:
            return self.exporter.export(metrics_data(self.state.snapshot())) is MetricExportResult.SUCCESS
        except Exception:
            log.exception("OTLP metrics export failed")
            return False

    def start(self) -> "OtlpMetricsPusher":
        self._loop.start()
        return self

    def stop(self) -> None:
        """Stop the timer, push once more, and shut the exporter down."""
        self._loop.stop()
        self.exporter.shutdown()


def tracer_provider(span_exporter=None, resource_attributes: Mapping[str, str] | None = None):
    """A tracer provider batching spans to OTLP/HTTP (or to ``span_exporter``)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if span_exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        span_exporter = OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "kvtier", **(resource_attributes or {})}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return provider


class RequestSpans:
    """Turns stored batches into request spans. ``observe`` fits ``Flusher(on_ingest=...)``."""

    def __init__(self, provider):
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE)

    def observe(self, batch: EventBatch, result=None) -> int:
        """Emit one span per request record in ``batch``; returns how many."""
        if batch.requests.num_rows == 0:
            return 0
        promotions, recomputes = _request_block_events(batch.block_events)
        origin = batch.origin
        for record in batch.requests.to_pylist():
            self._request_span(record, origin, promotions.get(record["request_id"], []),
                               recomputes.get(record["request_id"]))
        return batch.requests.num_rows

    def _request_span(self, r: dict, origin, promotions: list[dict], recompute: dict | None) -> None:
        from opentelemetry import trace

        start = int(r["arrival_s"] * _NS)
        duration_s = r["e2e_latency_s"] if r["e2e_latency_s"] is not None else (r["ttft_s"] or 0.0)
        span = self.tracer.start_span("text_completion", start_time=start, kind=trace.SpanKind.SERVER,
                                      attributes=_request_attributes(r, origin))
        context = trace.set_span_in_context(span)
        for event in promotions[:MAX_PROMOTION_SPANS]:
            child = self.tracer.start_span(
                "kvtier.promotion", context=context, start_time=int((event["time_s"] - event["latency_s"]) * _NS),
                attributes=_drop_none({"kvtier.tier_from": event["tier_from"], "kvtier.block_hash": f"{event['block_hash']:016x}",
                                       "kvtier.position": event["position"], "kvtier.tokens": event["tokens"],
                                       "kvtier.size_bytes": event["size_bytes"], "kvtier.latency_s": event["latency_s"]}))
            child.end(end_time=int(event["time_s"] * _NS))
        if len(promotions) > MAX_PROMOTION_SPANS:
            span.set_attribute("kvtier.promotions.not_traced", len(promotions) - MAX_PROMOTION_SPANS)
        if recompute is not None:
            child = self.tracer.start_span("kvtier.recompute", context=context,
                                           start_time=int(recompute["start_s"] * _NS),
                                           attributes={"kvtier.blocks": recompute["blocks"],
                                                       "kvtier.tokens": recompute["tokens"]})
            child.end(end_time=int(recompute["end_s"] * _NS))
        span.end(end_time=start + int(duration_s * _NS))

    def shutdown(self) -> None:
        self.provider.force_flush()
        self.provider.shutdown()


def _request_attributes(r: dict, origin) -> dict:
    served = [r["gpu_hit_tokens"], r["cpu_promotion_tokens"], r["cold_promotion_tokens"]]
    return _drop_none({
        "gen_ai.operation.name": "text_completion",
        "gen_ai.response.id": r["request_id"],
        "gen_ai.usage.input_tokens": r["prompt_tokens"],
        "gen_ai.usage.output_tokens": r["output_tokens"],
        "gen_ai.usage.cache_read.input_tokens": sum(served) if None not in served else None,
        "gen_ai.response.time_to_first_chunk": r["ttft_s"],
        "gen_ai.conversation.id": r["session_id"],
        "kvtier.engine": origin.engine,
        "kvtier.instance": origin.instance,
        "kvtier.tier_config": r["tier_config_id"],
        "kvtier.tokens.gpu_hit": r["gpu_hit_tokens"],
        "kvtier.tokens.cpu_promotion": r["cpu_promotion_tokens"],
        "kvtier.tokens.cold_promotion": r["cold_promotion_tokens"],
        "kvtier.tokens.recomputed": r["recomputed_tokens"],
        "kvtier.inter_token_latency_s": r["itl_s"],
        "kvtier.e2e_latency_s": r["e2e_latency_s"],
    })


def _drop_none(attributes: dict) -> dict:
    return {k: v for k, v in attributes.items() if v is not None}


def _request_block_events(table: pa.Table) -> tuple[dict, dict]:
    """Promotions (per request, in time order) and recompute summaries, from one batch."""
    if table.num_rows == 0:
        return {}, {}
    kind = pc.cast(table.column("kind"), pa.string())
    has_request = pc.is_valid(table.column("request_id"))
    promoted = table.filter(pc.and_(has_request, pc.and_(pc.is_in(kind, pa.array(["cpu_promotion", "cold_promotion"])),
                                                         pc.is_valid(table.column("latency_s")))))
    promotions: dict[str, list[dict]] = {}
    for row in promoted.sort_by("time_s").to_pylist():
        promotions.setdefault(row["request_id"], []).append(row)
    missed = table.filter(pc.and_(has_request, pc.equal(kind, "recompute_miss")))
    recomputes = {}
    if missed.num_rows:
        start = pc.subtract(missed.column("time_s"), pc.fill_null(missed.column("latency_s"), 0.0))
        grouped = (missed.append_column("start_s", start)
                   .group_by("request_id")
                   .aggregate([("block_hash", "count"), ("tokens", "sum"), ("start_s", "min"), ("time_s", "max")]))
        for row in grouped.to_pylist():
            recomputes[row["request_id"]] = {"blocks": row["block_hash_count"], "tokens": row["tokens_sum"] or 0,
                                             "start_s": row["start_s_min"], "end_s": row["time_s_max"]}
    return promotions, recomputes
