"""A vLLM-style ``/metrics`` subset (names and labels as vLLM 0.33.0 exposes them, see
``vllm/v1/metrics/loggers.py``), so kvtier's vLLM scraper profile reads the engine unchanged.

Prefix-cache counters are in tokens: ``prefix_cache_*`` for the GPU tier,
``external_prefix_cache_*`` for the CPU and file tiers (vLLM's connector counters), and
``prompt_tokens_cached_by_source`` with ``device`` (GPU), ``host`` (CPU) and ``disk`` (file).
A fresh registry per instance, so tests and several engines in one process never collide.
"""

from __future__ import annotations

from typing import Callable

from kvtier.collector.events import RequestRecord

LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class EngineMetrics:
    """Observes finished requests; gauges are read from the engine at scrape time."""

    def __init__(self, model_name: str, *, usage: Callable[[], float],
                 running: Callable[[], int], waiting: Callable[[], int], cache_info: dict[str, str],
                 transfers: Callable[[], dict[str, tuple[int, float]]] = dict):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry = CollectorRegistry()
        base = {"model_name": model_name, "engine": "0"}
        names = list(base)

        def counter(name, doc, extra=()):
            return Counter(name, doc, names + list(extra), registry=registry)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=registry).labels(**base)

        def gauge(name, doc, read):
            g = Gauge(name, doc, names, registry=registry, multiprocess_mode="mostrecent")
            g.labels(**base).set_function(read)

        self._base = base
        self.queries = counter("vllm:prefix_cache_queries", "GPU prefix cache queries (tokens)").labels(**base)
        self.hits = counter("vllm:prefix_cache_hits", "GPU prefix cache hits (tokens)").labels(**base)
        self.ext_queries = counter("vllm:external_prefix_cache_queries",
                                   "CPU/file tier queries (tokens)").labels(**base)
        self.ext_hits = counter("vllm:external_prefix_cache_hits", "CPU/file tier hits (tokens)").labels(**base)
        self.by_source = counter("vllm:prompt_tokens_cached_by_source", "cached prompt tokens by tier",
                                 ["source"])
        self.prompt = counter("vllm:prompt_tokens", "prompt tokens").labels(**base)
        self.generation = counter("vllm:generation_tokens", "generated tokens").labels(**base)
        self.computed = histogram("vllm:request_prefill_kv_computed_tokens",
                                  "KV tokens recomputed per request", TOKEN_BUCKETS)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "time to first token", LATENCY_BUCKETS_S)
        self.itl = histogram("vllm:inter_token_latency_seconds", "inter-token latency", LATENCY_BUCKETS_S)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "end-to-end latency", LATENCY_BUCKETS_S)
        gauge("vllm:kv_cache_usage_perc", "GPU KV blocks in use, 0..1", usage)
        gauge("vllm:num_requests_running", "requests in the running batch", running)
        gauge("vllm:num_requests_waiting", "requests waiting", waiting)
        info = Gauge("vllm:cache_config_info", "cache configuration", sorted(cache_info), registry=registry)
        info.labels(**cache_info).set(1)
        registry.register(_TransferCollector(base, transfers))

    def observe(self, record: RequestRecord) -> None:
        """Count one finished request (call from any one thread)."""
        gpu, cpu, cold = record.gpu_hit_tokens or 0, record.cpu_promotion_tokens or 0, record.cold_promotion_tokens or 0
        self.queries.inc(record.prompt_tokens)
        self.hits.inc(gpu)
        self.ext_queries.inc(record.prompt_tokens - gpu)
        self.ext_hits.inc(cpu + cold)
        for source, tokens in (("device", gpu), ("host", cpu), ("disk", cold)):
            self.by_source.labels(**self._base, source=source).inc(tokens)
        self.prompt.inc(record.prompt_tokens)
        self.generation.inc(record.output_tokens or 0)
        self.computed.observe(record.recomputed_tokens or 0)
        for histogram, value in ((self.ttft, record.ttft_s), (self.itl, record.itl_s),
                                 (self.e2e, record.e2e_latency_s)):
            if value is not None:
                histogram.observe(value)

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# kind -> (vLLM metric stem, extra labels): OffloadingConnector and Tiering counters
_TRANSFER_METRICS = {
    "load": ("vllm:kv_offload_load", {}), "store": ("vllm:kv_offload_store", {}),
    "tier_read": ("vllm:kv_offload_tiering_read", {"tier": "1:fs"}),
    "tier_write": ("vllm:kv_offload_tiering_write", {"tier": "1:fs"}),
}


class _TransferCollector:
    """Offload byte and time counters, read from the engine's sums at scrape time."""

    def __init__(self, base: dict[str, str], read: Callable[[], dict[str, tuple[int, float]]]):
        self._base, self._read = base, read

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        sums = self._read()
        for kind, (stem, extra) in _TRANSFER_METRICS.items():
            labels = {**self._base, **extra}
            size_bytes, seconds = sums.get(kind, (0, 0.0))
            for suffix, value, doc in (("_bytes", size_bytes, "bytes moved"), ("_time", seconds, "seconds spent")):
                family = CounterMetricFamily(stem + suffix, f"{kind}: {doc}", labels=list(labels))
                family.add_metric(list(labels.values()), value)
                yield family
