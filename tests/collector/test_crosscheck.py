"""Hooks against the engine's own /metrics, per counter over the same scrape intervals: a
store where both agree reads zero differences, one where they disagree reads how far, and
only settled intervals and instances with both sources are compared."""

from __future__ import annotations

import math

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.crosscheck import DEFAULT_WINDOW_S, CounterCheck, crosscheck
from kvtier.collector.events import BlockEvent, MetricInterval, Origin, Outcome, RequestRecord, Tier

HOOKS = Origin("vllm", "node-a", "vllm-hooks:node-a:7")
SCRAPE = Origin("vllm", "node-a", "vllm-scrape:node-a:http://127.0.0.1:8000/metrics:1")
LABELS = 'engine="0",model_name="m"'


def request(rid: str, arrival_s: float, done_s: float, *, prompt=100, gpu=40, cpu=32, recomputed=28):
    return RequestRecord(rid, arrival_s, prompt, output_tokens=4, gpu_hit_tokens=gpu,
                         cpu_promotion_tokens=cpu, cold_promotion_tokens=0,
                         recomputed_tokens=recomputed, e2e_latency_s=done_s - arrival_s)


CHUNK_BYTES = 4096


def store_event(time_s: float, block: int) -> BlockEvent:
    return BlockEvent(time_s, Outcome.STORE, block, size_bytes=CHUNK_BYTES, tier_from=Tier.GPU,
                      tier_to=Tier.CPU)


def intervals(start_s: float, end_s: float, prompt, gpu, cpu, recomputed, stores, *,
              asked: int | None = None, failed: int = 0):
    """The engine's series over one scrape interval: ``stores`` chunks stored, and ``asked``
    chunks asked for by prepare_store (vLLM's allocation-size histogram: every attempt, the
    ``failed`` ones too; ``None``: as many as stored)."""
    counter = lambda metric, value, labels=LABELS: MetricInterval(start_s, end_s, metric, "counter", value, labels)
    return [counter("vllm:prompt_tokens_total", prompt),
            counter("vllm:prefix_cache_hits_total", gpu),
            counter("vllm:external_prefix_cache_hits_total", cpu),
            counter("vllm:prompt_tokens_by_source_total", recomputed, LABELS + ',source="local_compute"'),
            counter("vllm:prompt_tokens_by_source_total", gpu, LABELS + ',source="local_cache_hit"'),
            counter("vllm:kv_offload_store_bytes_total", stores * CHUNK_BYTES),
            counter("vllm:kv_offload_allocation_failure_total", failed),
            MetricInterval(start_s, end_s, "vllm:kv_offload_cpu_allocation_size", "histogram",
                           1 + failed, LABELS, sum_value=stores if asked is None else asked)]


def fill(store, second_interval_prompt: float, *, asked_in_second: int | None = None,
         failed_in_second: int = 0) -> None:
    # interval 10-20: r1 (finished at 15) and 2 stores; interval 20-30: r2 (arrived at 18,
    # finished at 22: the engine counted its prompt in the first interval) and 1 store
    store.ingest(EventBatch.from_rows(HOOKS, 0, [store_event(12, 1), store_event(13, 2), store_event(25, 3)],
                                      [request("r1", 11, 15), request("r2", 18, 22),
                                       request("r3", 31, 34)]))  # r3: after the last interval
    store.ingest(EventBatch.from_intervals(SCRAPE, 0, intervals(10, 20, 200, 80, 64, 56, 2)))
    store.ingest(EventBatch.from_intervals(SCRAPE, 1, intervals(
        20, 30, second_interval_prompt - 100, 0, 0, 0, 1, asked=asked_in_second,
        failed=failed_in_second)))


def rows(store):
    return lambda sql, params: store.query(sql, params).to_pylist()


def by_counter(checks) -> dict[str, CounterCheck]:
    return {c.counter: c for c in checks}


def test_hooks_and_counters_that_agree_differ_by_zero(store):
    fill(store, second_interval_prompt=100)
    checks = by_counter(crosscheck(rows(store), now_s=100.0))
    assert {name: (c.hooks_total, c.engine_total) for name, c in checks.items()} == {
        "prompt_tokens": (200, 200), "gpu_hit_tokens": (80, 80), "cpu_promoted_tokens": (64, 64),
        "recomputed_tokens": (56, 56), "cpu_stored_bytes": (3 * CHUNK_BYTES, 3 * CHUNK_BYTES)}
    assert all(c.difference == 0 and c.ratio == 1.0 and not c.disagrees() for c in checks.values())
    assert {(c.instance, c.window_start_s, c.window_end_s) for c in checks.values()} == {("node-a", 10, 30)}


def test_stores_asked_for_and_refused_are_not_read_as_stores_the_hooks_missed(store):
    """A CPU tier full of chunks in flight: vLLM's prepare_store asks for 4 chunks, fails, is
    asked again each step (twice more), then stores 1. Its allocation-size histogram counts
    every attempt (13 chunks, tests/probes/vllm/side_counters.py shows vLLM's own manager
    doing so); the bytes stored are the hooks' 1 chunk, and nothing is flagged."""
    fill(store, second_interval_prompt=100, asked_in_second=13, failed_in_second=3)
    checks = by_counter(crosscheck(rows(store), now_s=100.0))
    stored = checks["cpu_stored_bytes"]
    assert (stored.hooks_total, stored.engine_total) == (3 * CHUNK_BYTES, 3 * CHUNK_BYTES)
    assert not any(c.disagrees() for c in checks.values())


def test_each_engine_series_compared_says_what_it_counts():
    from kvtier.collector.crosscheck import COUNTERS, checked_counter

    for engine, counters in COUNTERS.items():
        for counter in counters:
            assert checked_counter(engine, counter.name) is counter and counter.engine_counts
    assert "completed" in checked_counter("vllm", "cpu_stored_bytes").engine_counts
    assert all(c.metric != "vllm:kv_offload_cpu_allocation_size" for c in COUNTERS["vllm"])


def test_a_disagreement_is_measured_and_flagged_beyond_the_tolerance(store):
    fill(store, second_interval_prompt=150)  # the engine counted 50 prompt tokens more
    prompt = by_counter(crosscheck(rows(store), now_s=100.0))["prompt_tokens"]
    assert (prompt.hooks_total, prompt.engine_total, prompt.difference) == (200, 250, -50)
    assert prompt.ratio == pytest.approx(0.8)
    assert prompt.disagrees(tolerance=0.1) and not prompt.disagrees(tolerance=0.25)


def test_only_intervals_that_settled_are_compared(store):
    fill(store, second_interval_prompt=100)
    checks = by_counter(crosscheck(rows(store), now_s=27.0, settle_s=5.0))  # 20-30 ends after 22
    assert (checks["prompt_tokens"].hooks_total, checks["prompt_tokens"].engine_total) == (100, 200)
    assert checks["prompt_tokens"].window_end_s == 20
    assert crosscheck(rows(store), now_s=14.0) == ()  # nothing settled yet


def test_an_instance_without_hooks_or_without_a_scrape_is_not_checked(store):
    other = Origin("vllm", "node-b", "vllm-scrape:node-b:http://b/metrics:1")
    store.ingest(EventBatch.from_intervals(other, 0, intervals(10, 20, 5, 0, 0, 0, 0)))
    store.ingest(EventBatch.from_rows(Origin("vllm", "node-c", "vllm-hooks:node-c:1"), 0,
                                      requests=[request("c1", 11, 12)]))
    assert crosscheck(rows(store), now_s=100.0) == ()


def test_the_ratio_when_the_engine_counted_nothing():
    check = CounterCheck("vllm", "a", "cpu_stored_bytes", 3, 0, 0, 10)
    assert check.ratio == math.inf and check.disagrees()
    assert CounterCheck("vllm", "a", "cpu_stored_bytes", 0, 0, 0, 10).ratio == 1.0


def test_the_collector_exports_the_differences_at_scrape_time(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families
    import urllib.request

    from kvtier.collector.service import CollectorConfig, CollectorService

    config = CollectorConfig(store_path=tmp_path / "s.duckdb", metrics_port=0, instance="n1",
                             export_every_s=3600)
    service = CollectorService(config, clock=lambda: 100.0).start()
    try:
        fill(service.store, second_interval_prompt=150)
        text = urllib.request.urlopen(service.metrics.url, timeout=10).read().decode()
    finally:
        service.stop()
    seen = {(s.name, s.labels["counter"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith("kvtier_crosscheck_")}
    assert seen[("kvtier_crosscheck_difference", "prompt_tokens")] == -50
    assert seen[("kvtier_crosscheck_ratio", "prompt_tokens")] == pytest.approx(0.8)
    assert seen[("kvtier_crosscheck_difference", "cpu_stored_bytes")] == 0
    assert seen[("kvtier_crosscheck_window_end_seconds", "cpu_stored_bytes")] == 30
    metrics = {s.labels["counter"]: s.labels["engine_metric"] for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "kvtier_crosscheck_difference"}
    assert metrics["cpu_stored_bytes"] == "vllm:kv_offload_store_bytes_total"
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "kvtier_crosscheck_difference"]
    assert "vllm:kv_offload_store_bytes_total (vllm cpu_stored_bytes): bytes of GPU-to-CPU stores" \
        in family.documentation


def test_the_collector_compares_only_the_last_window_so_a_scrape_never_reads_all_history(store):
    """Intervals settled before the window are left out: an old disagreement ages out of the
    exported difference, and the query's cost does not grow with the store's age."""
    fill(store, second_interval_prompt=150)
    everything = by_counter(crosscheck(rows(store), now_s=100.0))
    assert everything  # the fixture's intervals all lie in the default hour
    assert crosscheck(rows(store), now_s=100.0 + 2 * DEFAULT_WINDOW_S) == ()
    assert by_counter(crosscheck(rows(store), now_s=100.0 + 2 * DEFAULT_WINDOW_S,
                                 window_s=float("inf"))) == everything
    later = by_counter(crosscheck(rows(store), now_s=100.0, window_s=100.0 - 5.0 - 20.0))
    assert {(c.window_start_s, c.window_end_s) for c in later.values()} == {(20, 30)}
    assert later["prompt_tokens"].engine_total == 50  # the second interval's increase alone
