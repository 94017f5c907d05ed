"""`kvtier collect --scrape`: a real HTTP server serving a vLLM page with LMCache inside, its
intervals stored; `--sglang-events`: SGLang's KV events over ZMQ, stored as SGLang's; `--help`
names both."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import duckdb
import pytest

from tests.conftest import ANY_PORT, bound_to
from tests.probes.fake_http import FakeEngineHttp
from tests.probes.scrape.test_scraper import LMCACHE, V1, V2, VLLM

pytestmark = pytest.mark.timeout(90)


def kvtier(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "kvtier", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_collect_help_lists_the_scrape_and_sglang_taps():
    done = kvtier("collect", "--help")
    assert done.returncode == 0
    for flag in ("--scrape URL[=PROFILE]", "--sglang-events ENDPOINT", "--vllm-replay ENDPOINT",
                 "--dynamo-events ENDPOINT"):
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


def test_collect_sglang_events_stores_sglangs_stream(tmp_path):
    """SGLang publishes vLLM's wire format (without a medium): a connecting publisher's
    BlockStored frames become SGLang's GPU stores in the store."""
    import time

    import msgpack
    import zmq

    store = tmp_path / "kvtier.duckdb"
    service = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "collect", "--store", str(store), "--metrics-port", "0",
         "--instance", "node-g", "--sglang-events", ANY_PORT, "--duration-s", "6"],
        stdout=subprocess.PIPE, text=True)
    publisher = zmq.Context.instance().socket(zmq.PUB)
    try:
        for line in service.stdout:
            if "tap VllmEventTap started" in line:
                endpoint = bound_to(line)  # the port the tap got for :0
                break
        publisher.connect(endpoint)
        for seq in range(12):
            events = [{"type": "BlockStored", "block_hashes": [500 + seq], "parent_block_hash": None,
                       "token_ids": list(range(16)), "block_size": 16, "lora_id": None}]
            publisher.send_multipart([b"", seq.to_bytes(8, "big"),
                                      msgpack.packb([time.time(), events, 0])])
            time.sleep(0.2)
        out, _ = service.communicate(timeout=60)
    finally:
        publisher.close(linger=0)
        service.kill() if service.poll() is None else None
    assert service.returncode == 0, out
    con = duckdb.connect(str(store), read_only=True)
    try:
        stored = con.execute(
            "SELECT count(*), min(source) LIKE 'sglang-zmq:node-g:%', count(DISTINCT engine) "
            "FROM block_events_with_origin WHERE engine = 'sglang' AND kind = 'store' "
            "AND tier_to = 'gpu' AND tokens = 16").fetchone()
    finally:
        con.close()
    assert stored[0] >= 6 and stored[1] and stored[2] == 1  # a slow joiner may miss the first



def test_scrape_instance_names_the_instance_the_scraped_pages_serve():
    """--scrape-instance gives the scraped page the engine's own instance name (its hooks'
    kvtier_instance), so the collector cross-checks the two; without it, --instance."""
    import argparse

    from kvtier.verbs.collect import _taps, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--store", "s.duckdb", "--instance", "node", "--scrape", "http://127.0.0.1:8000/metrics=vllm"]
    named = _taps(parser.parse_args(argv + ["--scrape-instance", "engine-a"]), "node", [])[0]
    default = _taps(parser.parse_args(argv), "node", [])[0]
    assert [t.args[0].instance for t in named + default] == ["engine-a", "node"]
