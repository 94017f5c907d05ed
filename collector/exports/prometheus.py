"""Prometheus ``/metrics``: a custom collector that formats the aggregates at scrape time.

Metric names follow Prometheus conventions (base units, ``_total`` on counters). The serving
instance is labelled ``engine_instance``: Prometheus's own ``instance`` label names the scrape
target (this collector), and the two would clash.

=============================================  =====================================================
``kvtier_block_events_total``                  block events by kind, tier, engine, instance, source; a
                                               movement two sources report is counted once
``kvtier_block_tokens_total``                  tokens those events covered (token-weighted hit quality)
``kvtier_block_events_reported_total``         block events as each source reported them (duplicates kept)
``kvtier_promotion_seconds``                   histogram of promotion latency by source tier
``kvtier_recomputed_tokens_total``             prompt tokens recomputed (request records)
``kvtier_requests_total``                      requests by tier configuration
``kvtier_request_ttft_seconds``                histogram of time to first token by tier configuration
``kvtier_request_itl_seconds``                 histogram of mean inter-token latency by tier configuration
``kvtier_rejected_rows_total``                 malformed rows left out at ingest, by reason
``kvtier_*`` from sources                      recorder drops, tap errors, sequence gaps (``Sample``)
``kvtier_recommendation_info``                 the current recommendation, as labels
=============================================  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from kvtier.collector.exports.aggregate import HistogramState, MetricsSnapshot, MetricsState


@dataclass(frozen=True, slots=True)
class Sample:
    """One value from a live component (a recorder, a tap): read at scrape time.

    ``name`` is the full metric name; a name ending in ``_total`` is exported as a counter,
    anything else as a gauge.
    """

    name: str
    help: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


SampleSource = Callable[[], Iterable[Sample]]


class KvtierCollector:
    """A ``prometheus_client`` custom collector over a ``MetricsState`` and live sources."""

    def __init__(self, state: MetricsState, sources: Iterable[SampleSource] = (),
                 recommendation: Callable[[], Mapping[str, str] | None] = lambda: None):
        self.state = state
        self.sources = list(sources)
        self.recommendation = recommendation

    def collect(self):
        snap = self.state.snapshot()
        yield from _aggregate_families(snap)
        yield from _sample_families(sample for source in self.sources for sample in source())
        info = self.recommendation()
        if info:
            family = InfoMetricFamily("kvtier_recommendation", "The current kvtier recommendation")
            family.add_metric([], {str(k): str(v) for k, v in info.items()})
            yield family


def _aggregate_families(snap: MetricsSnapshot):
    block_labels = ["kind", "tier", "engine", "engine_instance", "source"]
    events = CounterMetricFamily("kvtier_block_events", "Block events by outcome kind and tier, "
                                 "each counted once across sources", labels=block_labels)
    tokens = CounterMetricFamily("kvtier_block_tokens", "Tokens covered by block events", labels=block_labels)
    for key, value in sorted(snap.block_events.items()):
        events.add_metric(list(key), value)
        tokens.add_metric(list(key), snap.block_tokens.get(key, 0))
    reported = CounterMetricFamily("kvtier_block_events_reported", "Block events as each source "
                                   "reported them, movements two sources report included twice",
                                   labels=block_labels)
    for key, value in sorted(snap.block_events_reported.items()):
        reported.add_metric(list(key), value)
    recomputed = CounterMetricFamily("kvtier_recomputed_tokens", "Prompt tokens recomputed by prefill",
                                     labels=["engine", "engine_instance"])
    for key, value in sorted(snap.recomputed_tokens.items()):
        recomputed.add_metric(list(key), value)
    config_labels = ["tier_config", "engine", "engine_instance"]
    requests = CounterMetricFamily("kvtier_requests", "Requests by tier configuration", labels=config_labels)
    for key, value in sorted(snap.requests.items()):
        requests.add_metric(list(key), value)
    rejected = CounterMetricFamily("kvtier_rejected_rows", "Malformed rows left out at ingest", labels=["reason"])
    for key, value in sorted(snap.rejected_rows.items()):
        rejected.add_metric(list(key), value)
    yield from (events, tokens, reported, recomputed, requests, rejected)
    yield _histogram("kvtier_promotion_seconds", "Promotion latency to GPU by source tier",
                     ["tier_from", "engine", "engine_instance"], snap.promotion_s)
    yield _histogram("kvtier_request_ttft_seconds", "Time to first token", config_labels, snap.ttft_s)
    yield _histogram("kvtier_request_itl_seconds", "Mean inter-token latency per request", config_labels, snap.itl_s)


def _histogram(name: str, documentation: str, labels: list[str], states: dict[tuple, HistogramState]):
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for key, state in sorted(states.items()):
        cumulative = state.counts.cumsum()
        buckets = [(_le(bound), int(c)) for bound, c in zip(state.bounds_s, cumulative)]
        buckets.append(("+Inf", int(cumulative[-1])))
        family.add_metric(list(key), buckets, state.sum_s)
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


def _sample_families(samples: Iterable[Sample]):
    families: dict[str, object] = {}
    for sample in samples:
        family = families.get(sample.name)
        if family is None:
            labels = sorted(sample.labels)
            if sample.name.endswith("_total"):
                family = CounterMetricFamily(sample.name[: -len("_total")], sample.help, labels=labels)
            else:
                family = GaugeMetricFamily(sample.name, sample.help, labels=labels)
            families[sample.name] = family
        family.add_metric([str(sample.labels[k]) for k in sorted(sample.labels)], sample.value)
    yield from families.values()


class MetricsServer:
    """``/metrics`` over HTTP, on loopback unless told otherwise, with its own registry.

    With ``health`` (a callable returning ``(ok, body)``) it also serves ``/healthz``: the body
    as JSON, status 200 when ``ok`` and 503 otherwise; ``routes`` add JSON pages
    (:func:`kvtier.collector.exports.http.serve`). Binding errors (``OSError``: address in
    use, a host that does not resolve or is not this host's) reach the caller.
    """

    def __init__(self, collector: KvtierCollector, host: str = "127.0.0.1", port: int = 0,
                 health: Callable[[], tuple[bool, dict]] | None = None,
                 routes: dict | None = None):
        from kvtier.collector.bounded_http import ServerMetrics
        from kvtier.collector.exports.http import serve

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._server, self._thread = serve(self.registry, host, port, health, routes)
        self.host, self.port = self._server.server_address[:2]
        self.registry.register(ServerMetrics(self._server))  # its 503s and connections

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    @property
    def health_url(self) -> str:
        return self.url.rsplit("/", 1)[0] + "/healthz"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
