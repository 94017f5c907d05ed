"""A real Prometheus server scrapes the collector on loopback; we read series back by PromQL."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from kvtier.collector.exports.aggregate import MetricsState
from kvtier.collector.exports.prometheus import KvtierCollector, MetricsServer
from tests.conftest import free_port, require_binary
from tests.collector.exports.conftest import sample_batch


def query(base: str, promql: str) -> list:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for_series(base: str, promql: str, timeout_s: float = 40.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = query(base, promql)
            if result:
                return result
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"no series for {promql} within {timeout_s} s")


@pytest.fixture
def prometheus(tmp_path):
    def start(target: str) -> str:
        port = free_port()  # Prometheus binds the port it is given and names no port it picked
        config = tmp_path / "prometheus.yml"
        config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                          "scrape_configs:\n  - job_name: kvtier\n"
                          f"    static_configs: [{{targets: ['{target}']}}]\n")
        process = subprocess.Popen([require_binary("prometheus"), f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
                                    f"--storage.tsdb.path={tmp_path / 'data'}"],
                                   stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
        processes.append(process)
        return f"http://127.0.0.1:{port}"

    processes = []
    yield start
    for process in processes:
        process.kill()
        process.wait(timeout=10)


def test_prometheus_scrapes_outcomes_and_promotion_quantiles(prometheus, clock):
    state = MetricsState(clock=clock)
    state.observe(sample_batch())
    with MetricsServer(KvtierCollector(state)) as server:
        base = prometheus(f"127.0.0.1:{server.port}")
        hits = wait_for_series(base, 'kvtier_block_events_total{kind="gpu_hit"}')
        assert hits[0]["metric"]["engine_instance"] == "node-1" and hits[0]["metric"]["engine"] == "vllm"
        assert float(hits[0]["value"][1]) == 7
        by_kind = {r["metric"]["kind"]: float(r["value"][1])
                   for r in query(base, "sum by (kind) (kvtier_block_events_total)")}
        assert by_kind == {"cpu_promotion": 50, "cold_promotion": 3, "gpu_hit": 7, "recompute_miss": 4, "evict": 1}
        quantiles = {r["metric"]["tier_from"]: float(r["value"][1]) for r in query(
            base, "histogram_quantile(0.99, sum by (le, tier_from) (kvtier_promotion_seconds_bucket))")}
        # CPU promotions took 0.4..20 ms: p99 falls in the (10 ms, 25 ms] bucket.
        assert 0.01 < quantiles["cpu"] <= 0.025
        # Cold promotions took 30, 40 and 60 ms: p99 falls in the (50 ms, 100 ms] bucket.
        assert 0.05 < quantiles["cold"] <= 0.1
        ttft = query(base, 'histogram_quantile(0.5, sum by (le) (kvtier_request_ttft_seconds_bucket{tier_config="gpu+cpu"}))')
        assert 0.05 < float(ttft[0]["value"][1]) <= 0.1


def test_every_grafana_query_is_valid_promql_with_data(prometheus, clock):
    from kvtier.collector.exports.grafana import panel_queries

    state = MetricsState(clock=clock)
    state.observe(sample_batch())
    with MetricsServer(KvtierCollector(state)) as server:
        base = prometheus(f"127.0.0.1:{server.port}")
        wait_for_series(base, "kvtier_block_events_total")
        for queries in panel_queries().values():
            for expr, _ in queries:
                concrete = (expr.replace("$__rate_interval", "1m").replace("$engine_instance", ".*")
                            .replace("$engine", ".*").replace("$tier_config", ".*"))
                query(base, concrete)  # raises on a PromQL error
        # A query the dashboard shows reads the exported series back (counters over an instant).
        served = query(base, 'sum(kvtier_block_tokens_total{kind=~"gpu_hit|cpu_promotion|cold_promotion"})')
        assert float(served[0]["value"][1]) == (50 + 3 + 7) * 16
