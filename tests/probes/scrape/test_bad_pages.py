"""What a scraped page may not bring into the store: served by a real HTTP server on 127.0.0.1,
scraped by the collector's tap into a DuckDB file.

A series missing from a page (left off, or cut off by a body shorter than its Content-Length)
keeps its last value, so its next increase is what the engine counted since, not its whole
cumulative value; NaN, infinite and negative counter values and decreasing histogram buckets
are left out and counted in the store's ledger by the schema's reasons; a page with a series
twice, or one that is not Prometheus text, is refused whole and the tap fails on /healthz,
with a short reason and short log lines whatever the page held."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

import pytest

from kvtier.collector.service import CollectorConfig, CollectorService
from kvtier.collector.store import TraceStore
from kvtier.collector.taps import Backoff, TapRunner
from kvtier.probes.scrape.metrics_tap import ScrapeTap, ScrapeTapConfig
from tests.probes.fake_http import FakeEngineHttp
from tests.probes.scrape.test_scraper import V1, V2, VLLM, Clock

pytestmark = pytest.mark.timeout(60)

HITS = "vllm:prefix_cache_hits_total"


def page(**values) -> bytes:
    return VLLM.format(**dict(V1, **values)).encode()


def without(body: bytes, name: str) -> bytes:
    return b"".join(line for line in body.splitlines(keepends=True)
                    if not line.startswith(name.encode()))


@pytest.fixture
def engine():
    server = FakeEngineHttp()
    yield server
    server.close()


@pytest.fixture
def store(tmp_path):
    with TraceStore(tmp_path / "kvtier.duckdb") as s:
        yield s


def scrape(engine, store, answers, rounds=None) -> TapRunner:
    """Serve ``answers`` in order and let the tap's runner take each once."""
    engine.routes[("GET", "/metrics")] = list(answers)
    tap = ScrapeTap(ScrapeTapConfig(engine.url + "/metrics", "vllm", instance="node-s"),
                    store.ingest, clock=Clock())
    runner = TapRunner(tap)
    for _ in range(rounds or len(answers)):
        runner.step()
    return runner


def increase(store, metric: str) -> float:
    return store.scalar("SELECT sum(value) FROM metric_intervals WHERE metric = ?", [metric])


def test_a_series_missing_from_one_page_counts_from_its_last_value(engine, store):
    """The engine counted 4,000 hits between the first and the last page; the page between
    them left the series off. 14,000 (its whole value) must not be stored as an increase."""
    scrape(engine, store, [(200, page(hits=10_000)), (200, without(page(hits=12_000), HITS)),
                           (200, page(hits=14_000))])
    assert increase(store, HITS) == 4_000
    assert store.scalar("SELECT count(*) FROM metric_intervals WHERE metric = ?", [HITS]) == 1


def test_a_body_shorter_than_its_content_length_is_a_failed_scrape(engine, store):
    full = page(hits=12_000)
    cut = full[:full.index(HITS.encode())]  # the connection closes before the hits line
    runner = scrape(engine, store, [(200, page(hits=10_000)), (200, cut, len(full))], rounds=2)
    health = runner.health()
    assert health.state == "retrying"
    assert f"the body ended after {len(cut):,} of the {len(full):,} bytes" in health.last_error
    assert store.count("metric_intervals") == 0  # nothing of the short page was stored
    engine.routes[("GET", "/metrics")] = [(200, page(hits=14_000))]
    runner.step()
    assert runner.health().up and increase(store, HITS) == 4_000


def test_values_that_break_the_schemas_rules_are_left_out_and_counted(engine, store):
    bad = page(hits="NaN", queries=-5, usage="+Inf", b1=9, b2=7, b3=10)  # buckets go down
    runner = scrape(engine, store, [(200, page()), (200, bad),
                                    (200, page(hits=300, queries=700, b1=2, b2=8, b3=12))])
    assert runner.health().up  # the rest of each page was usable
    assert store.scalar("SELECT count(*) FROM metric_intervals WHERE NOT isfinite(value) "
                        "OR NOT isfinite(coalesce(sum_value, 0))") == 0
    assert store.scalar("SELECT count(*) FROM metric_intervals WHERE metric = "
                        "'vllm:kv_cache_usage_perc' AND value > 1") == 0
    # each refused series kept its last usable value: increases since the first page
    assert increase(store, HITS) == 200
    assert increase(store, "vllm:prefix_cache_queries_total") == 300
    assert increase(store, "vllm:time_to_first_token_seconds") == 8
    assert dict(store.rejected_total) == {"value not finite": 2, "negative counter value": 1,
                                          "histogram buckets decrease": 1}
    assert store.scalar("SELECT sum(rejected) FROM ingested_batches") == 4


def test_a_page_with_a_series_twice_is_refused_whole(engine, store):
    good = page(hits=100)
    twice = page(hits=150) + f'{HITS}{{engine="0",model_name="m"}} 999\n'.encode()
    runner = scrape(engine, store, [(200, good), (200, twice)])
    health = runner.health()
    assert health.state == "retrying" and "twice" in health.last_error
    assert store.count("metric_intervals") == 0
    engine.routes[("GET", "/metrics")] = [(200, page(hits=160))]
    runner.step()
    assert increase(store, HITS) == 60  # from the last usable page, over the refused one
    assert store.scalar("SELECT max(end_s - start_s) FROM metric_intervals") == 20


def test_a_page_whose_every_series_breaks_a_rule_is_a_tap_failure(engine, store):
    nan_only = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} NaN\n'
    runner = scrape(engine, store, [(200, page()), (200, nan_only.encode())])
    health = runner.health()
    assert health.state == "retrying"
    assert health.last_error == "every vllm series on the page broke a rule (value not finite)"


def read_health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_tap_whose_pages_are_garbage_fails_on_healthz_with_a_short_reason(engine, tmp_path,
                                                                           caplog):
    """A 60 MB page of one line under a named profile: /healthz says the tap is failing and
    why in one short line, and the log does not copy the page (not even once)."""
    engine.routes[("GET", "/metrics")] = [(200, b"x" * (60 << 20) + b"\n")]
    config = CollectorConfig(store_path=tmp_path / "s.duckdb", metrics_port=0, instance="n1")
    url = engine.url + "/metrics"
    factory = lambda on_batch: ScrapeTap(  # noqa: E731
        ScrapeTapConfig(url, "vllm", interval_s=0.1, timeout_s=30), on_batch)
    with caplog.at_level(logging.DEBUG):
        service = CollectorService(config, [factory], backoff=Backoff(0.05, 0.2)).start()
        try:
            deadline = time.monotonic() + 45  # bounds a broken tap, not a timing assertion
            status, body = read_health(service.metrics.health_url)
            while body["taps"][0]["failures_total"] < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
                status, body = read_health(service.metrics.health_url)
        finally:
            service.stop()
    (tap,) = body["taps"]
    assert status == 503 and body["status"] == "failing" and tap["state"] == "retrying"
    assert tap["last_error"].startswith("not Prometheus text exposition (a line of 62,914,560 "
                                        "characters")
    assert len(tap["last_error"]) < 600
    assert max(len(r.getMessage()) for r in caplog.records) < 1000
