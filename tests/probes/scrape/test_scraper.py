"""Metric scrapers: Prometheus text fixtures built from the documented metric names
(vLLM 0.33.0; LMCache metrics.rst cce4a08; SGLang HiCache; Dynamo KVBM prometheus_names.rs
628d4ec; TensorRT-LLM MetricsCollector 2026), served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import pytest

from tests.probes.fake_http import FakeEngineHttp
from kvtier.probes.scrape.intervals import HistogramDelta, SeriesKey
from kvtier.probes.scrape.page import parse_snapshot
from kvtier.probes.scrape.scraper import MetricScraper, ScraperConfig

pytestmark = pytest.mark.timeout(20)


def increase_of(interval, name: str, **labels: str) -> float:
    """Sum of the increases of counter ``name`` over the interval's series matching ``labels``."""
    return sum(v for k, v in interval.counters.items() if k.matches(name, labels))

VLLM = """\
# HELP vllm:prefix_cache_hits GPU prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
vllm:prefix_cache_hits_created{{engine="0",model_name="m"}} {created}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
# TYPE vllm:prompt_tokens_cached_by_source counter
vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",source="device"}} {device}
vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",source="host"}} {host}
# TYPE vllm:kv_offload_load_bytes counter
vllm:kv_offload_load_bytes_total{{engine="0",model_name="m"}} {load_bytes}
# TYPE vllm:kv_offload_load_time counter
vllm:kv_offload_load_time_total{{engine="0",model_name="m"}} {load_time}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {b1}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.5",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {tsum}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 3
# TYPE python_gc_objects_collected counter
python_gc_objects_collected_total{{generation="0"}} 100
"""

V1 = dict(hits=100, created=1.7e9, queries=400, device=100, host=0, load_bytes=0, load_time=0,
          usage=0.5, b1=1, b2=3, b3=4, tsum=1.0)
V2 = dict(V1, hits=160, queries=500, host=64, load_bytes=2 << 20, load_time=0.25, usage=0.75,
          b1=1, b2=7, b3=10, tsum=3.0)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        self.now += 10
        return self.now


@pytest.fixture
def engine():
    server = FakeEngineHttp()
    yield server
    server.close()


def scrape_pair(engine, name, path, first, second, **config):
    engine.routes[("GET", path)] = [(200, first.encode()), (200, second.encode())]
    got = []
    scraper = MetricScraper(ScraperConfig(engine=name, url=engine.url + path, **config),
                            got.append, clock=Clock())
    assert scraper.poll() is None  # the first scrape is the baseline
    interval = scraper.poll()
    assert got == [interval]
    return interval


def test_vllm_counters_become_increases_and_histograms_interval_observations(engine):
    iv = scrape_pair(engine, "vllm", "/metrics", VLLM.format(**V1), VLLM.format(**V2))
    assert (iv.engine, iv.start_s, iv.end_s, iv.duration_s) == ("vllm", 110.0, 120.0, 10.0)
    assert increase_of(iv, "vllm:prefix_cache_hits_total") == 60
    assert increase_of(iv, "vllm:prompt_tokens_cached_by_source_total", source="host") == 64
    assert increase_of(iv, "vllm:prompt_tokens_cached_by_source_total") == 64  # device +0
    assert increase_of(iv, "vllm:kv_offload_load_bytes_total") == 2 << 20
    assert iv.gauge("vllm:kv_cache_usage_perc") == 0.75
    ttft = iv.histogram("vllm:time_to_first_token_seconds")
    assert ttft == HistogramDelta(((0.1, 0.0), (0.5, 4.0), (float("inf"), 6.0)), 2.0, 6.0)
    assert ttft.quantile(0.5) == pytest.approx(0.1 + 0.4 * 3 / 4)
    assert not iv.resets
    assert all(not k.name.startswith("python_") for k in iv.counters)  # outside the profile


def test_a_counter_that_went_down_was_reset(engine):
    after_restart = dict(V1, hits=7, b1=0, b2=1, b3=1, tsum=0.2)
    iv = scrape_pair(engine, "vllm", "/metrics", VLLM.format(**V2), VLLM.format(**after_restart))
    assert increase_of(iv, "vllm:prefix_cache_hits_total") == 7
    assert iv.histogram("vllm:time_to_first_token_seconds").count == 1
    assert SeriesKey("vllm:prefix_cache_hits_total", (("engine", "0"), ("model_name", "m"))) \
        in iv.resets


def test_a_new_created_time_is_a_reset_even_if_the_value_grew(engine):
    iv = scrape_pair(engine, "vllm", "/metrics", VLLM.format(**V1),
                     VLLM.format(**dict(V1, hits=150, created=1.8e9)))
    assert increase_of(iv, "vllm:prefix_cache_hits_total") == 150


LMCACHE = """\
# TYPE lmcache:num_hit_tokens counter
lmcache:num_hit_tokens_total{{model_name="m",worker_id="0"}} {hit}
# TYPE lmcache:num_l2_hit_tokens counter
lmcache:num_l2_hit_tokens_total{{model_name="m",worker_id="0"}} {l2}
# TYPE lmcache:time_to_retrieve histogram
lmcache:time_to_retrieve_bucket{{le="0.01",model_name="m",worker_id="0"}} {r}
lmcache:time_to_retrieve_bucket{{le="+Inf",model_name="m",worker_id="0"}} {r}
lmcache:time_to_retrieve_count{{model_name="m",worker_id="0"}} {r}
lmcache:time_to_retrieve_sum{{model_name="m",worker_id="0"}} 0.01
# TYPE lmcache:local_cache_usage gauge
lmcache:local_cache_usage{{model_name="m",worker_id="0"}} 1.5e9
"""

SGLANG = """\
# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{{cache_source="device",model_name="m"}} {dev}
sglang:cached_tokens_total{{cache_source="host",model_name="m"}} {host}
# TYPE sglang:evicted_tokens counter
sglang:evicted_tokens_total{{model_name="m"}} {ev}
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{model_name="m"}} 0.4
"""

KVBM = """\
# HELP kvbm_offload_blocks_d2h Blocks offloaded device to host
# TYPE kvbm_offload_blocks_d2h counter
kvbm_offload_blocks_d2h {d2h}
# TYPE kvbm_onboard_blocks_h2d counter
kvbm_onboard_blocks_h2d {h2d}
# TYPE kvbm_host_cache_hit_rate gauge
kvbm_host_cache_hit_rate 0.25
"""

TRTLLM = """\
# TYPE trtllm_kv_cache_offload_bytes counter
trtllm_kv_cache_offload_bytes_total{{model_name="m"}} {off}
# TYPE trtllm_kv_cache_reused_blocks counter
trtllm_kv_cache_reused_blocks_total{{model_name="m"}} {reused}
# TYPE trtllm_kv_cache_host_utilization gauge
trtllm_kv_cache_host_utilization{{model_name="m"}} 0.6
"""


@pytest.mark.parametrize("name, path, text, v1, v2, counter, labels, increase, gauge", [
    ("lmcache", "/metrics", LMCACHE, dict(hit=10, l2=4, r=2), dict(hit=30, l2=9, r=5),
     "lmcache:num_l2_hit_tokens_total", {}, 5, ("lmcache:local_cache_usage", 1.5e9)),
    ("sglang", "/metrics", SGLANG, dict(dev=5, host=1, ev=0), dict(dev=9, host=11, ev=3),
     "sglang:cached_tokens_total", {"cache_source": "host"}, 10, ("sglang:cache_hit_rate", 0.4)),
    ("dynamo", "/metrics", KVBM, dict(d2h=1, h2d=0), dict(d2h=41, h2d=2),
     "kvbm_offload_blocks_d2h_total", {}, 40, ("kvbm_host_cache_hit_rate", 0.25)),
    ("trtllm", "/prometheus/metrics", TRTLLM, dict(off=0, reused=3), dict(off=4096, reused=8),
     "trtllm_kv_cache_offload_bytes_total", {}, 4096,
     ("trtllm_kv_cache_host_utilization", 0.6)),
])
def test_engine_profiles(engine, name, path, text, v1, v2, counter, labels, increase, gauge):
    iv = scrape_pair(engine, name, path, text.format(**v1), text.format(**v2))
    assert increase_of(iv, counter, **labels) == increase
    assert iv.gauge(gauge[0]) == gauge[1]


def test_lmcache_histogram_increase(engine):
    iv = scrape_pair(engine, "lmcache", "/metrics", LMCACHE.format(hit=1, l2=1, r=2),
                     LMCACHE.format(hit=1, l2=1, r=5))
    assert iv.histogram("lmcache:time_to_retrieve").count == 3


def test_failures_are_counted_and_the_baseline_kept(engine):
    engine.routes[("GET", "/metrics")] = [
        (200, VLLM.format(**V1).encode()), (500, b"oops"), (200, b"{{{ not prometheus"),
        (200, VLLM.format(**V2).encode())]
    scraper = MetricScraper(ScraperConfig(engine="vllm", url=engine.url + "/metrics"),
                            lambda iv: None, clock=Clock())
    results = [scraper.poll() for _ in range(4)]
    assert results[:3] == [None, None, None]
    assert increase_of(results[3], "vllm:prefix_cache_hits_total") == 60
    assert (results[3].start_s, results[3].end_s) == (110, 130)  # spans the bad scrapes
    assert scraper.stats.fetch_errors == 1 and scraper.stats.parse_errors == 1


def test_quantile_edges():
    hist = HistogramDelta(((1.0, 2.0), (float("inf"), 4.0)), 10.0, 4.0)
    assert hist.quantile(0.25) == 0.5 and hist.quantile(1.0) == 1.0
    assert HistogramDelta((), 0.0, 0.0).quantile(0.5) is None
    with pytest.raises(ValueError):
        hist.quantile(2)


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="known: vllm"):
        ScraperConfig(engine="ollama")


def test_parse_snapshot_prefix_filter():
    snap = parse_snapshot(VLLM.format(**V1), 1.0, ("vllm:kv_cache_usage",))
    assert list(snap.gauges) == [SeriesKey("vllm:kv_cache_usage_perc",
                                           (("engine", "0"), ("model_name", "m")))]
    assert not snap.counters and not snap.histograms
