"""`kvtier collect --scrape`: a real HTTP server serving a vLLM page with LMCache inside, its
intervals stored; `--help` names the scrape and SGLang taps."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import duckdb
import pytest

from tests.probes.fake_http import FakeEngineHttp
from tests.probes.scrape.test_scraper import LMCACHE, V1, V2, VLLM

pytestmark = pytest.mark.timeout(90)


def kvtier(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "kvtier", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_collect_help_lists_the_scrape_and_sglang_taps():
    done = kvtier("collect", "--help")
    assert done.returncode == 0
    for flag in ("--scrape URL[=PROFILE]", "--sglang-events ENDPOINT", "--vllm-replay ENDPOINT"):
        assert flag in done.stdout
    assert "vllm, lmcache, sglang, dynamo, trtllm" in " ".join(done.stdout.split())


def test_collect_scrape_stores_each_intervals_series_and_reports_health(tmp_path):
    server = FakeEngineHttp()
    page = lambda v, l: (VLLM.format(**v) + LMCACHE.format(**l)).encode()
    growing = [page(dict(V1, hits=100 + 10 * i), dict(hit=10 + i, l2=4, r=2)) for i in range(60)]
    server.routes[("GET", "/metrics")] = [(200, body) for body in growing]
    server.routes[("GET", "/lmcache")] = [(200, page(V1, dict(hit=1, l2=1, r=1))),
                                          (200, page(V2, dict(hit=5, l2=1, r=1)))]
    store = tmp_path / "kvtier.duckdb"
    service = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "collect", "--store", str(store), "--metrics-port", "0",
         "--instance", "node-s", "--scrape", server.url + "/metrics",
         "--scrape", server.url + "/lmcache=lmcache", "--scrape-interval-s", "0.2",
         "--duration-s", "4"], stdout=subprocess.PIPE, text=True)
    try:
        health_url, taps = None, []
        for line in service.stdout:
            if "health at" in line:
                health_url = line.split("health at ", 1)[1].strip()
            if "tap ScrapeTap started" in line:
                taps.append(line)
            if len(taps) == 2:
                break
        health = json.loads(urllib.request.urlopen(health_url, timeout=5).read())
        out, _ = service.communicate(timeout=60)
    finally:
        service.kill() if service.poll() is None else None
        server.close()
    assert service.returncode == 0, out
    assert health["status"] == "ok"
    assert sorted(t["name"] for t in health["taps"] if t["kind"] == "ScrapeTap") == [
        server.url + "/lmcache", server.url + "/metrics"]
    con = duckdb.connect(str(store), read_only=True)
    try:
        hits = con.execute(
            "SELECT count(*), sum(value), min(end_s - start_s) > 0, any_value(engine) "
            "FROM metric_intervals_with_origin WHERE metric = 'vllm:prefix_cache_hits_total' "
            "AND instance = 'node-s'").fetchone()
        lmcache = con.execute(
            "SELECT engine, sum(value) FROM metric_intervals_with_origin "
            "WHERE metric = 'lmcache:num_hit_tokens_total' GROUP BY engine ORDER BY engine").fetchall()
    finally:
        con.close()
    count, total, forward, engine = hits
    assert count >= 2 and total == 10 * count and forward and engine == "vllm"
    # the guessed vLLM page keeps LMCache's families too; the named profile only LMCache's
    assert dict(lmcache)["lmcache"] == 4 and dict(lmcache)["vllm"] >= 2


def test_a_scrape_url_that_is_not_http_is_one_line_and_exit_2(tmp_path):
    done = kvtier("collect", "--store", str(tmp_path / "s.duckdb"), "--scrape",
                  "ftp://127.0.0.1/metrics", "--metrics-port", "0", "--duration-s", "1")
    assert done.returncode == 2
    assert "--scrape 'ftp://127.0.0.1/metrics': url must be http(s)" in done.stderr
