"""The HTTP server: OpenAI completions (plain and streamed), continuous batching under
concurrency, the vLLM-style /metrics read by kvtier's vLLM scraper, the tier switch, the store."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvtier.refengine.server import MODEL_NAME, EngineServer, ServerSettings
from kvtier.probes.scrape.scraper import MetricScraper, ScraperConfig
from tests.refengine.conftest import prompt, run, tiny_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server(tmp_path):
    srv = EngineServer(tiny_config(tmp_path, gpu_blocks=12),
                       ServerSettings(port=0, store_path=str(tmp_path / "store.duckdb")))
    try:
        yield srv.start()
    finally:
        srv.stop()


def post(url: str, body: dict, timeout_s: float = 60) -> tuple[int, bytes]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def complete(server, tokens, max_tokens=4, **extra) -> dict:
    status, body = post(server.url + "/v1/completions",
                        {"model": MODEL_NAME, "prompt": tokens, "max_tokens": max_tokens, **extra})
    assert status == 200, body
    return json.loads(body)


def sse_events(body: bytes) -> list:
    lines = [line[len(b"data: "):] for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_completion_matches_the_engine_run_directly(server, make_engine):
    direct = run(make_engine(tiny_config(gpu_blocks=12)), "direct", prompt(1)).output
    first = complete(server, prompt(1))
    again = complete(server, prompt(1))
    assert first["choices"][0]["token_ids"] == again["choices"][0]["token_ids"] == direct
    assert first["usage"]["prompt_tokens"] == 13 and first["usage"]["completion_tokens"] == 4
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
    assert again["kvtier"]["gpu_hit_tokens"] == 12 and again["kvtier"]["recomputed_tokens"] == 1


def test_streamed_tokens_equal_the_plain_response(server):
    plain = complete(server, prompt(2), max_tokens=6)
    status, body = post(server.url + "/v1/completions",
                        {"prompt": prompt(2), "max_tokens": 6, "stream": True,
                         "stream_options": {"include_usage": True}})
    events = sse_events(body)
    streamed = [t for e in events for t in e["choices"][0]["token_ids"]]
    assert status == 200 and streamed == plain["choices"][0]["token_ids"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 6


def test_concurrent_requests_queue_and_all_finish(tmp_path):
    srv = EngineServer(tiny_config(gpu_blocks=10), ServerSettings(port=0))
    step, opened = srv.engine.step, []

    def step_once_all_arrived():  # no timing luck: the engine starts when all 8 are queued
        if not opened and srv.engine.queued_requests < 8:
            return False
        opened.append(True)
        return step()

    srv.engine.step = step_once_all_arrived
    srv.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: complete(srv, prompt(i), max_tokens=8), range(8)))
        assert [r["usage"]["completion_tokens"] for r in results] == [8] * 8
        assert len({r["id"] for r in results}) == 8
        assert srv.engine.scheduler.peak_waiting == 8  # 10 blocks hold one request of 6 blocks
    finally:
        srv.stop()


def test_metrics_parse_with_the_vllm_scraper_profile(server):
    scraper = MetricScraper(ScraperConfig(engine="vllm", url=server.url + "/metrics"), lambda i: None)
    assert scraper.poll() is None  # baseline
    complete(server, prompt(3))
    complete(server, prompt(3))
    interval = scraper.poll()
    counters = {key.name: value for key, value in interval.counters.items()}
    assert counters["vllm:prompt_tokens_total"] == 26
    assert counters["vllm:prefix_cache_hits_total"] == 12
    assert counters["vllm:prefix_cache_queries_total"] == 26
    ttft = [h for k, h in interval.histograms.items() if k.name == "vllm:time_to_first_token_seconds"]
    assert ttft and ttft[0].count == 2


def test_admin_switch_names_the_next_requests_phase(server):
    status, body = post(server.url + "/admin/tiers",
                        {"gpu_blocks": 12, "cpu_blocks": 8, "config_id": "plus-cpu"})
    assert status == 202 and json.loads(body)["pending"]["cpu_blocks"] == 8
    assert complete(server, prompt(4))["kvtier"]["tier_config_id"] == "plus-cpu"
    with urllib.request.urlopen(server.url + "/admin/tiers", timeout=30) as response:
        active = json.loads(response.read())
    assert active["config_id"] == "plus-cpu" and active["switch_pending"] is False


@pytest.mark.parametrize("body, fragment", [
    ({"gpu_blocks": 4, "colour": "red"}, "allowed"),
    ({"gpu_blocks": 4, "eviction_policy": "random"}, "lru, fifo"),
])
def test_admin_switch_rejects_bad_configs(server, body, fragment):
    status, reply = post(server.url + "/admin/tiers", body)
    assert status == 400 and fragment in json.loads(reply)["error"]["message"]


@pytest.mark.parametrize("body, status", [
    ({"prompt": [], "max_tokens": 2}, 400),
    ({"prompt": [1, 2], "max_tokens": 0}, 400),
    ({"prompt": [1, 500], "max_tokens": 2}, 400),  # outside the vocabulary
    ({"prompt": "text", "max_tokens": 2}, 400),  # vocab 97 < 256: text needs token ids
    ({"prompt": [1, 2], "model": "gpt-9"}, 404),
    ({"prompt": list(range(60)), "max_tokens": 2}, 400),  # more blocks than the GPU tier
])
def test_bad_requests_are_refused(server, body, status):
    assert post(server.url + "/v1/completions", body)[0] == status


def test_requests_reach_the_store_and_agree_with_their_block_events(tmp_path):
    path = tmp_path / "store.duckdb"
    config = tiny_config(tmp_path, gpu_blocks=5, cpu_blocks=5, cold_blocks=40)
    srv = EngineServer(config, ServerSettings(port=0, store_path=str(path))).start()
    try:
        for i in (1, 2, 3, 4, 1, 2, 1):
            complete(srv, prompt(i))
    finally:
        srv.stop()
    from kvtier.collector.store import TraceStore

    with TraceStore(path) as store:
        assert store.count("requests") == 7
        agreement = store.query("""
            WITH served AS (
              SELECT request_id,
                     coalesce(sum(tokens) FILTER (WHERE kind = 'gpu_hit'), 0) AS gpu,
                     coalesce(sum(tokens) FILTER (WHERE kind = 'cpu_promotion'), 0) AS cpu,
                     coalesce(sum(tokens) FILTER (WHERE kind = 'cold_promotion'), 0) AS cold,
                     coalesce(sum(tokens) FILTER (WHERE kind = 'recompute_miss'), 0) AS recomputed
              FROM block_events WHERE request_id IS NOT NULL GROUP BY request_id)
            SELECT count(*) AS joined,
                   count(*) FILTER (WHERE (r.gpu_hit_tokens, r.cpu_promotion_tokens, r.cold_promotion_tokens,
                                           r.recomputed_tokens) != (s.gpu, s.cpu, s.cold, s.recomputed)) AS differ
            FROM requests r JOIN served s USING (request_id)""").to_pylist()[0]
        served = store.scalar("SELECT sum(cpu_promotion_tokens + cold_promotion_tokens) FROM requests")
    assert agreement == {"joined": 7, "differ": 0} and served > 0


def test_a_failing_step_answers_500_and_the_server_keeps_serving(server, monkeypatch):
    real = server.engine._prefill
    calls = {"n": 0}

    def broken_once(seq):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("disk on fire")
        return real(seq)

    monkeypatch.setattr(server.engine, "_prefill", broken_once)
    status, body = post(server.url + "/v1/completions", {"prompt": prompt(5), "max_tokens": 2})
    assert status == 500 and "disk on fire" in json.loads(body)["error"]["message"]
    assert complete(server, prompt(6), max_tokens=2)["usage"]["completion_tokens"] == 2


def test_offload_counters_match_the_promotions_served(tmp_path):
    config = tiny_config(tmp_path, gpu_blocks=5, cpu_blocks=5, cold_blocks=40)
    srv = EngineServer(config, ServerSettings(port=0)).start()
    try:
        scraper = MetricScraper(ScraperConfig(engine="vllm", url=srv.url + "/metrics"), lambda i: None)
        scraper.poll()
        replies = [complete(srv, prompt(i)) for i in (1, 2, 1, 3, 4, 5, 1)]
        interval = scraper.poll()
    finally:
        srv.stop()
    counters = {key.name: value for key, value in interval.counters.items()}
    cpu = sum(r["kvtier"]["cpu_promotion_tokens"] for r in replies)
    cold = sum(r["kvtier"]["cold_promotion_tokens"] for r in replies)
    assert cpu > 0 and cold > 0
    blocks = (cpu + cold) // config.block_size_tokens  # cold promotions end with a CPU->GPU copy
    assert counters["vllm:kv_offload_load_bytes_total"] == blocks * config.block_bytes
    assert counters["vllm:kv_offload_tiering_read_bytes_total"] == cold // config.block_size_tokens * config.block_bytes
    assert counters["vllm:kv_offload_store_bytes_total"] > 0
    by_source = {key.label("source"): value for key, value in interval.counters.items()
                 if key.name == "vllm:prompt_tokens_cached_by_source_total"}
    assert by_source == {"device": sum(r["kvtier"]["gpu_hit_tokens"] for r in replies),
                         "host": cpu, "disk": cold}
