"""The scrapers as collector taps: a vLLM page with LMCache's families inside it, served by a
real HTTP server on 127.0.0.1, scraped into the store's metric_intervals table."""

from __future__ import annotations

import pytest

from kvtier.collector.store import TraceStore
from kvtier.collector.taps import TapRunner
from kvtier.probes.scrape.profiles import guess_profiles
from kvtier.probes.scrape.metrics_tap import ScrapeTap, ScrapeTapConfig
from tests.probes.fake_http import FakeEngineHttp
from tests.probes.scrape.test_scraper import LMCACHE, V1, V2, VLLM, Clock

pytestmark = pytest.mark.timeout(20)

LMC1, LMC2 = dict(hit=10, l2=4, r=2), dict(hit=30, l2=9, r=5)


def vllm_with_lmcache(vllm: dict, lmcache: dict) -> bytes:
    """vLLM's /metrics when LMCache runs in its process: both registries on one page."""
    return (VLLM.format(**vllm) + LMCACHE.format(**lmcache)).encode()


@pytest.fixture
def engine():
    server = FakeEngineHttp()
    yield server
    server.close()


def scraped(engine, config_engine=None):
    engine.routes[("GET", "/metrics")] = [(200, vllm_with_lmcache(V1, LMC1)),
                                          (200, vllm_with_lmcache(V2, LMC2))]
    store = TraceStore(":memory:")
    tap = ScrapeTap(ScrapeTapConfig(engine.url + "/metrics", config_engine, instance="node-s"),
                    store.ingest, clock=Clock())
    assert tap.poll() == 0  # the baseline
    assert tap.poll() == 1
    return tap, store


def test_the_profile_is_guessed_from_the_series_names():
    text = vllm_with_lmcache(V1, LMC1).decode()
    assert guess_profiles(text) == ("vllm", "lmcache")
    assert guess_profiles(LMCACHE.format(**LMC1)) == ("lmcache",)
    assert guess_profiles("# nothing\nprocess_cpu_seconds_total 3\n") == ()


def test_lmcaches_server_page_and_dynamos_worker_page_are_guessed():
    """LMCache 0.5.6's ``lmcache server`` page and a Dynamo 1.6.1 worker's system page (which
    also carries a few ``vllm:`` series), by the names those servers expose."""
    server = ('lmcache_mp_lookup_hit_tokens_total{model_name="m"} 6144.0\n'
              'lmcache_mp_l1_usage_ratio{backend="dram",l1_tag="_default"} 0.0\n')
    worker = ('dynamo_component_requests_total{dynamo_endpoint="generate"} 3\n'
              'dynamo_component_kv_publisher_zmq_events_total{event_type="stored"} 19\n'
              'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0\n')
    assert guess_profiles(server) == ("lmcache",)
    assert guess_profiles(worker) == ("dynamo", "vllm")
    assert guess_profiles("dynamo_frontend_requests_total{model=\"tiny\"} 3\n") == ("dynamo",)


def test_a_vllm_page_with_lmcache_inside_is_stored_as_intervals(engine):
    tap, store = scraped(engine)
    assert tap.engine == "vllm"
    rows = {(r["metric"], r["labels"]): r for r in store.query(
        "SELECT * FROM metric_intervals_with_origin").to_pylist()}
    hits = rows[("vllm:prefix_cache_hits_total", 'engine="0",model_name="m"')]
    assert (hits["kind"], hits["value"], hits["start_s"], hits["end_s"]) == ("counter", 60, 120, 130)
    assert (hits["engine"], hits["instance"], hits["sequence"]) == ("vllm", "node-s", 0)
    host = rows[("vllm:prompt_tokens_cached_by_source_total", 'engine="0",model_name="m",source="host"')]
    assert host["value"] == 64
    ttft = rows[("vllm:time_to_first_token_seconds", 'engine="0",model_name="m"')]
    assert (ttft["kind"], ttft["value"], ttft["sum_value"]) == ("histogram", 6, 2.0)
    usage = rows[("vllm:kv_cache_usage_perc", 'engine="0",model_name="m"')]
    assert (usage["kind"], usage["value"], usage["reset"]) == ("gauge", 0.75, None)
    # LMCache's families, kept because the page holds them
    assert rows[("lmcache:num_hit_tokens_total", 'model_name="m",worker_id="0"')]["value"] == 20
    assert rows[("lmcache:time_to_retrieve", 'model_name="m",worker_id="0"')]["value"] == 3
    assert not any(metric.startswith("python_") for metric, _ in rows)


def test_a_named_profile_keeps_only_its_families(engine):
    tap, store = scraped(engine, "lmcache")
    assert tap.engine == "lmcache"
    metrics = {r["metric"] for r in store.query("SELECT metric FROM metric_intervals").to_pylist()}
    assert metrics and all(m.startswith("lmcache:") for m in metrics)


def test_an_unreachable_or_foreign_page_is_a_tap_failure_on_health(engine):
    engine.routes[("GET", "/other")] = [(200, b"process_cpu_seconds_total 3\n")]
    runner = TapRunner(ScrapeTap(ScrapeTapConfig(engine.url + "/other"), lambda batch: None))
    runner.open()
    runner.step()
    health = runner.health()
    assert health.state == "retrying" and "no series of a known engine" in health.last_error
    down = TapRunner(ScrapeTap(ScrapeTapConfig(engine.url + "/missing"), lambda batch: None))
    down.step()
    assert down.health().state == "retrying" and "404" in down.health().last_error


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="http"):
        ScrapeTapConfig("127.0.0.1:8000/metrics")
    with pytest.raises(ValueError, match="known: vllm"):
        ScrapeTapConfig("http://127.0.0.1:8000/metrics", "ollama")
