"""The /metrics text: names, labels and values computed from ingested batches."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from kvtier.collector.events import Origin
from kvtier.collector.exports.aggregate import MetricsState
from kvtier.collector.exports.prometheus import KvtierCollector, MetricsServer, Sample
from tests.collector.exports.conftest import CPU_LATENCIES_S, sample_batch


def scrape(state, **kwargs):
    with MetricsServer(KvtierCollector(state, **kwargs)) as server:
        assert server.host == "127.0.0.1"
        text = urllib.request.urlopen(server.url, timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_outcome_counters_and_promotion_histogram(clock):
    state = MetricsState(clock=clock)
    state.observe(sample_batch())
    state.observe(sample_batch(sequence=1))
    samples = scrape(state)
    base = (("engine", "vllm"), ("engine_instance", "node-1"))
    block = base + (("source", "recorder"),)
    assert samples[("kvtier_block_events_total", tuple(sorted(block + (("kind", "cpu_promotion"), ("tier", "cpu")))))] == 100
    assert samples[("kvtier_block_events_total", tuple(sorted(block + (("kind", "gpu_hit"), ("tier", "gpu")))))] == 14
    assert samples[("kvtier_block_events_total", tuple(sorted(block + (("kind", "evict"), ("tier", "cpu")))))] == 2
    assert samples[("kvtier_block_tokens_total", tuple(sorted(block + (("kind", "recompute_miss"), ("tier", "gpu")))))] == 128
    cpu = tuple(sorted(base + (("tier_from", "cpu"),)))
    assert samples[("kvtier_promotion_seconds_count", cpu)] == 100
    assert abs(samples[("kvtier_promotion_seconds_sum", cpu)] - 2 * sum(CPU_LATENCIES_S)) < 1e-9
    # 0.4 ms .. 20 ms in 0.4 ms steps: 2 x 2 values <= 1 ms, 2 x 12 values <= 5 ms, all <= 25 ms.
    assert samples[("kvtier_promotion_seconds_bucket", tuple(sorted(cpu + (("le", "0.001"),))))] == 4
    assert samples[("kvtier_promotion_seconds_bucket", tuple(sorted(cpu + (("le", "0.005"),))))] == 24
    assert samples[("kvtier_promotion_seconds_bucket", tuple(sorted(cpu + (("le", "0.025"),))))] == 100
    assert samples[("kvtier_recomputed_tokens_total", base)] == 128
    config = tuple(sorted(base + (("tier_config", "gpu+cpu+cold"),)))
    assert samples[("kvtier_requests_total", config)] == 2
    assert samples[("kvtier_request_ttft_seconds_bucket", tuple(sorted(config + (("le", "0.25"),))))] == 0
    assert samples[("kvtier_request_ttft_seconds_bucket", tuple(sorted(config + (("le", "0.5"),))))] == 2


def test_live_sources_and_recommendation_are_read_at_scrape_time(clock):
    gaps = {"n": 3}
    tap = lambda: [Sample("kvtier_tap_sequence_gaps_total", "Gaps", gaps["n"], {"tap": "vllm-zmq"})]  # noqa: E731
    collector_kwargs = dict(sources=[tap],
                            recommendation=lambda: {"engine": "trtllm", "knob": "secondary_offload_min_priority",
                                                    "value": "40"})
    samples = scrape(MetricsState(clock=clock), **collector_kwargs)
    assert samples[("kvtier_tap_sequence_gaps_total", (("tap", "vllm-zmq"),))] == 3
    info = (("engine", "trtllm"), ("knob", "secondary_offload_min_priority"), ("value", "40"))
    assert samples[("kvtier_recommendation_info", info)] == 1
    gaps["n"] = 5
    assert scrape(MetricsState(clock=clock), **collector_kwargs)[("kvtier_tap_sequence_gaps_total", (("tap", "vllm-zmq"),))] == 5


def test_rejections_are_exported_by_reason(origin, clock):
    from kvtier.collector.batch import EventBatch

    state = MetricsState(clock=clock)
    state.observe(EventBatch.from_rows(origin, 0, [{"time_s": 1.0, "kind": "gpu_hit", "block_hash": 1, "tier_to": "hbm"}]))
    assert scrape(state)[("kvtier_rejected_rows_total", (("reason", "unknown tier"),))] == 1


def test_recommendation_file_becomes_an_info_metric_and_follows_changes(tmp_path, clock):
    import json
    import os

    from kvtier.collector.exports.recommendation import RecommendationLabels

    path = tmp_path / "recommendation.json"
    labels = RecommendationLabels(path)
    assert labels() is None  # no recommendation yet: no info metric
    path.write_text(json.dumps({"kind": "kvtier.recommendation", "settings": {"offload_min_priority": 40,
                     "retention_priorities": [0, 35, 80]}, "evidence": {"verdict": "offload"}}))
    samples = scrape(MetricsState(clock=clock), recommendation=labels)
    info = (("offload_min_priority", "40"), ("retention_priorities", "0,35,80"), ("verdict", "offload"))
    assert samples[("kvtier_recommendation_info", info)] == 1
    path.write_text(json.dumps({"settings": {"cpu_tier_bytes": 0}, "evidence": {"verdict": "do_not_offload"}}))
    os.utime(path, (1, 1))  # a new mtime even within the same clock tick
    assert labels() == {"cpu_tier_bytes": "0", "verdict": "do_not_offload"}
    path.write_text("{not json")
    os.utime(path, (2, 2))
    assert labels() is None


def test_the_recommendations_check_is_a_label_of_its_info_metric(tmp_path):
    import json

    from kvtier.collector.exports.recommendation import CHECK_FILE, RecommendationLabels

    path = tmp_path / "recommendation.json"
    path.write_text(json.dumps({"settings": {"cpu_tier_bytes": 65536}, "evidence": {"verdict": "offload"}}))
    labels = RecommendationLabels(path)
    assert "promises" not in labels()  # not checked yet
    for held, label in ((None, "too_few"), (True, "held"), (False, "not_held")):
        (tmp_path / CHECK_FILE).write_text(json.dumps({"held": held, "promises": []}) + " " * len(label))
        assert labels()["promises"] == label  # the check's file changed: read again


def offload_batch(origin, sequence, stored, evicted, gpu_stored=()):
    """A source's view of CPU offloads: stores GPU->CPU, evictions from CPU, and (the KV-event
    tap only) stores into the GPU."""
    from kvtier.collector.batch import EventBatch

    rows = [{"time_s": 1.0, "kind": "store", "block_hash": h, "tokens": 32,
             "tier_from": "gpu", "tier_to": "cpu"} for h in stored]
    rows += [{"time_s": 2.0, "kind": "evict", "block_hash": h, "tokens": 32, "tier_from": "cpu"}
             for h in evicted]
    rows += [{"time_s": 0.5, "kind": "store", "block_hash": h, "tokens": 32, "tier_to": "gpu"}
             for h in gpu_stored]
    return EventBatch.from_rows(origin, sequence, rows)


def test_an_offload_reported_by_the_hooks_and_the_kv_event_tap_counts_once(clock):
    """One CPU store seen by both sources of one engine: the aggregate counts it once, under the
    hooks (which carry its request and latency); what each source reported stays readable."""
    hooks = Origin("vllm", "node-1", "vllm-hooks:node-1:engine-0:1700000000000")
    tap = Origin("vllm", "node-1", "vllm-zmq:node-1::dp0:1700000000000.0")
    state = MetricsState(clock=clock)
    state.observe(offload_batch(hooks, 0, stored=[1, 2], evicted=[9]))
    state.observe(offload_batch(tap, 0, stored=[1, 2], evicted=[9], gpu_stored=[1, 2, 3]))
    samples = scrape(state)

    def series(name, kind, tier, source):
        labels = (("engine", "vllm"), ("engine_instance", "node-1"), ("kind", kind),
                  ("source", source), ("tier", tier))
        return samples.get((name, labels))

    assert series("kvtier_block_events_total", "store", "gpu", "hooks") == 2
    assert series("kvtier_block_tokens_total", "store", "gpu", "hooks") == 64
    assert series("kvtier_block_events_total", "evict", "cpu", "hooks") == 1
    assert series("kvtier_block_events_total", "evict", "cpu", "kv_events") is None
    # the tap's stores into the GPU (tier "gpu" too: no tier_from) are its own: nobody else
    # reports them; its two offloads are left to the hooks' series
    assert series("kvtier_block_events_total", "store", "gpu", "kv_events") == 3
    assert series("kvtier_block_tokens_total", "store", "gpu", "kv_events") == 96
    total = sum(v for (name, labels), v in samples.items() if name == "kvtier_block_events_total"
                and ("kind", "store") in labels)
    assert total == 2 + 3  # two offloads, three GPU stores: each once
    assert series("kvtier_block_events_reported_total", "store", "gpu", "kv_events") == 5
    assert series("kvtier_block_events_reported_total", "store", "gpu", "hooks") == 2


def test_without_hooks_the_kv_event_tap_counts_its_offloads(clock):
    tap = Origin("sglang", "node-2", "sglang-zmq:node-2::dp0:1700000000000.0")
    state = MetricsState(clock=clock)
    state.observe(offload_batch(tap, 0, stored=[1, 2], evicted=[9]))
    samples = scrape(state)
    labels = (("engine", "sglang"), ("engine_instance", "node-2"), ("kind", "store"),
              ("source", "kv_events"), ("tier", "gpu"))
    assert samples[("kvtier_block_events_total", labels)] == 2

