"""OTLP/HTTP export to a real receiver on loopback: metrics and request spans, attributes checked."""

from __future__ import annotations

from kvtier.collector.exports.aggregate import MetricsState
from kvtier.collector.exports.otlp import OtlpMetricsPusher, RequestSpans, tracer_provider
from tests.collector.exports.conftest import CPU_LATENCIES_S, T0, sample_batch


def attributes(proto_attributes) -> dict:
    out = {}
    for kv in proto_attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_metrics_reach_the_receiver_with_the_same_numbers(otlp_receiver, monkeypatch, clock):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=inference-platform")
    state = MetricsState(clock=clock)
    state.observe(sample_batch())
    pusher = OtlpMetricsPusher(state, interval_s=60)
    assert pusher.push()
    request = otlp_receiver.wait_for("/v1/metrics")[0]
    assert otlp_receiver.headers[0]["x-team"] == "inference-platform"
    resource = attributes(request.resource_metrics[0].resource.attributes)
    assert resource["service.name"] == "kvtier"
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    events = {(a["kind"], a["tier"]): p.as_int for p in metrics["kvtier.block.events"].sum.data_points
              for a in [attributes(p.attributes)]}
    assert events[("cpu_promotion", "cpu")] == 50 and events[("gpu_hit", "gpu")] == 7
    assert metrics["kvtier.block.events"].sum.is_monotonic
    promotion = {attributes(p.attributes)["tier_from"]: p for p in metrics["kvtier.promotion.duration"].histogram.data_points}
    assert promotion["cpu"].count == 50
    assert abs(promotion["cpu"].sum - sum(CPU_LATENCIES_S)) < 1e-9
    assert list(promotion["cpu"].explicit_bounds)[:3] == [25e-6, 50e-6, 100e-6]
    assert sum(promotion["cpu"].bucket_counts) == 50
    assert metrics["kvtier.promotion.duration"].unit == "s"
    ttft = {attributes(p.attributes)["tier_config"]: p.count for p in metrics["kvtier.request.time_to_first_token"].histogram.data_points}
    assert ttft == {"gpu+cpu": 1, "gpu+cpu+cold": 1}


def test_each_request_is_a_span_with_promotion_and_recompute_children(otlp_receiver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_receiver.endpoint + "/v1/traces")
    spans = RequestSpans(tracer_provider())
    assert spans.observe(sample_batch()) == 2
    spans.shutdown()
    received = [span for request in otlp_receiver.wait_for("/v1/traces")
                for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    by_name = {}
    for span in received:
        by_name.setdefault(span.name, []).append(span)
    requests = {attributes(s.attributes)["gen_ai.response.id"]: s for s in by_name["text_completion"]}
    b = requests["req-b"]
    attrs = attributes(b.attributes)
    assert attrs["gen_ai.operation.name"] == "text_completion"
    assert attrs["gen_ai.usage.input_tokens"] == 224 and attrs["gen_ai.usage.output_tokens"] == 10
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 160
    assert attrs["gen_ai.response.time_to_first_chunk"] == 0.3
    assert attrs["gen_ai.conversation.id"] == "s-1"
    assert attrs["kvtier.tier_config"] == "gpu+cpu+cold" and attrs["kvtier.tokens.recomputed"] == 64
    assert b.start_time_unix_nano == int((T0 + 2) * 1e9)
    assert b.end_time_unix_nano - b.start_time_unix_nano == int(0.5 * 1e9)

    children_of_b = [s for s in received if s.parent_span_id == b.span_id]
    promotions = [s for s in children_of_b if s.name == "kvtier.promotion"]
    assert sorted(attributes(s.attributes)["kvtier.latency_s"] for s in promotions) == [0.03, 0.04, 0.06]
    assert {attributes(s.attributes)["kvtier.tier_from"] for s in promotions} == {"cold"}
    assert all(s.trace_id == b.trace_id for s in children_of_b)
    (recompute,) = [s for s in children_of_b if s.name == "kvtier.recompute"]
    assert attributes(recompute.attributes) == {"kvtier.blocks": 4, "kvtier.tokens": 64}
    a_children = [s for s in received if s.parent_span_id == requests["req-a"].span_id]
    assert len(a_children) == 50 and {s.name for s in a_children} == {"kvtier.promotion"}
