"""Recommend and analyze from what the engine measured: the KV geometry from a store's block
events, costs from a calibrate file or the store, every default named; each engine's
recommendation holds only its own knobs; a model near chance sets no threshold."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, Tier
from kvtier.collector.reader import open_store
from kvtier.collector.store import TraceStore
from kvtier.policy.cost import CostParams
from kvtier.policy.geometry import geometry_for
from kvtier.policy.recommend import gate
from kvtier.policy.recommend.measured import store_costs
from kvtier.verbs import analyze as analyze_verb
from kvtier.verbs import recommend as recommend_verb
from tests.policy.learn.synthetic import conversations
from tests.policy.learn.test_evaluate import write_mooncake

BLOCK_TOKENS = 32
BLOCK_BYTES = 65_536  # what vLLM's hooks record per 32-token block: 2,048 bytes per token
PROMOTION_S = 0.0004


def run(verb, argv):
    parser = argparse.ArgumentParser()
    verb.add_arguments(parser)
    return verb.run(parser.parse_args(argv))


def vllm_like_store(path, requests: int = 300, served_under: str | None = None):
    """Request records, and CPU promotion events that carry bytes and latency but no tokens
    (as vLLM's hooks write them). ``served_under``: a tier configuration every request was
    served under, each with the split and TTFT the engine measured (all recomputed, as a
    GPU-only phase serves a cold prefix)."""
    records = conversations(requests, seed=11, block_tokens=BLOCK_TOKENS)
    if served_under is not None:
        records = [dataclasses.replace(
            r, gpu_hit_tokens=0, cpu_promotion_tokens=0, cold_promotion_tokens=0,
            recomputed_tokens=r.prompt_tokens, ttft_s=0.02 + r.prompt_tokens / 8_000,
            tier_config_id=served_under) for r in records]
    events = [BlockEvent(r.arrival_s, Outcome.CPU_PROMOTION, h, request_id=r.request_id,
                         position=i, size_bytes=BLOCK_BYTES, tier_from=Tier.CPU,
                         tier_to=Tier.GPU, latency_s=PROMOTION_S)
              for r in records[:50] for i, h in enumerate(r.block_hashes[:2])]
    with TraceStore(path) as store:
        store.ingest(EventBatch.from_rows(Origin("vllm", "node-1", "node-1/hooks"), 1,
                                          events, records))
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return vllm_like_store(tmp_path_factory.mktemp("s") / "kvtier.duckdb")


def test_recommend_sizes_the_cpu_tier_by_the_bytes_the_store_recorded(store, tmp_path, capsys):
    out = tmp_path / "reco"
    assert run(recommend_verb, ["--store", str(store), "--gpu-tokens", str(30 * BLOCK_TOKENS),
                                "--cpu-tokens", str(100 * BLOCK_TOKENS), "--engine", "vllm",
                                "--host-headroom-bytes", str(1 << 40), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads((out / "recommendation.json").read_text())
    assert doc["settings"]["cpu_tier_bytes"] == 100 * BLOCK_BYTES  # not 100 blocks of 4 MiB
    sizes = {s["tier"]: s for s in doc["evidence"]["sizes"]}
    assert sizes["cpu"]["block_bytes"] == BLOCK_BYTES
    inputs = {i["name"]: i for i in doc["evidence"]["inputs"]}
    assert inputs["kv_bytes_per_token"]["value"] == 2048
    assert inputs["kv_bytes_per_token"]["source"] == "measured"
    assert inputs["gpu_tokens"]["source"] == "given"
    report = (out / "report.md").read_text()
    assert "llama" not in report and "llama" not in text
    # what is still a default is named: vLLM's hooks time no recompute
    assert inputs["prefill_tokens_per_s"]["source"] == "default"
    assert "`prefill_tokens_per_s`" in report.split("Documented defaults, not measured")[1]
    assert "default: " in text and "prefill_tokens_per_s" in text


def test_analyze_prices_blocks_by_the_store_s_bytes(store, capsys):
    assert run(analyze_verb, ["--store", str(store), "--json"]) == 0
    sizing = json.loads(capsys.readouterr().out)["block_sizing"]
    assert sizing["bytes_per_block"] == BLOCK_BYTES and sizing["geometry_source"] == "measured"
    assert run(analyze_verb, ["--store", str(store)]) == 0
    text = capsys.readouterr().out
    assert "2,048 bytes per token (measured" in text and "llama" not in text


def test_a_custom_geometry_flag_prices_a_trace(tmp_path, capsys):
    trace = write_mooncake(tmp_path / "t.jsonl", conversations(200, seed=3, block_tokens=512))
    assert run(analyze_verb, ["--trace", str(trace), "--kv-bytes-per-token", "1024", "--json"]) == 0
    sizing = json.loads(capsys.readouterr().out)["block_sizing"]
    assert sizing["bytes_per_block"] == 512 * 1024 and sizing["geometry_source"] == "given"
    assert run(analyze_verb, ["--trace", str(trace)]) == 0
    assert "default model's, not measured" in capsys.readouterr().out


def test_store_costs_count_tokens_from_bytes_per_load_when_events_carry_none(store):
    reader = open_store(store)
    try:
        params, _ = store_costs(reader, CostParams(model=geometry_for(2048)), BLOCK_TOKENS)
    finally:
        reader.store.close()
    # each request's two events are one load (same time, same latency): 64 tokens in PROMOTION_S
    per_token_s = PROMOTION_S / (2 * BLOCK_BYTES / 2048)
    assert params.cpu_gpu_bandwidth_bytes_per_s.source == "measured"
    assert params.cpu_gpu_bandwidth_bytes_per_s.value == pytest.approx(2048 / per_token_s)


def _recommend_trace(trace, out, *extra):
    return run(recommend_verb, ["--trace", str(trace), "--gpu-tokens", str(30 * 512),
                                "--cpu-tokens", str(200 * 512), "--prefill-servers", "4",
                                "--host-headroom-bytes", str(1 << 40), "--engine", "vllm",
                                "--out", str(out), *extra])


@pytest.fixture(scope="module")
def trace_recommendations(tmp_path_factory):
    root = tmp_path_factory.mktemp("cp")
    trace = write_mooncake(root / "t.jsonl", conversations(600, seed=8, block_tokens=512))
    slow = root / "cost.json"  # a calibrate file: a prefill ten times slower than the default
    slow.write_text(json.dumps({"probe": "calibrate", "kv_bytes_per_token": 131072,
                                "cost_params": {"prefill_tokens_per_s": 800.0}}))
    assert _recommend_trace(trace, root / "plain") == 0
    assert _recommend_trace(trace, root / "calibrated", "--cost-params", str(slow)) == 0
    return {name: json.loads((root / name / "recommendation.json").read_text())
            for name in ("plain", "calibrated")}


def test_cost_params_reach_the_expected_change(trace_recommendations):
    def changes(doc):
        return {c["metric"]: c for c in doc["evidence"]["expected_vs_gpu_only"]}

    plain, calibrated = trace_recommendations["plain"], trace_recommendations["calibrated"]
    # on defaults no TTFT is promised, and the recommendation says why and what to run
    assert "ttft_p50_s" not in changes(plain) and "recompute_tokens" in changes(plain)
    card = plain["evidence"]["latency_model"]
    assert card["model"] is None and "default" in card["why"] and "calibrate" in card["why"]
    # a calibrated prefill rate makes a promise: 512-token blocks at 800 tokens/s take 0.64 s
    assert calibrated["evidence"]["latency_model"]["model"] == "queue"
    assert changes(calibrated)["ttft_p50_s"]["baseline"] > 0.6
    inputs = {i["name"]: i for i in calibrated["evidence"]["inputs"]}
    assert inputs["prefill_tokens_per_s"] == {"name": "prefill_tokens_per_s", "value": 800.0,
                                              "source": "calibrated",
                                              "note": "fitted by kvtier calibrate"}
    assert inputs["kv_bytes_per_token"]["source"] == "calibrated"
    assert {i["name"]: i for i in plain["evidence"]["inputs"]}[
        "kv_bytes_per_token"]["source"] == "default"


def test_a_vllm_recommendation_holds_no_tensorrt_llm_priorities(trace_recommendations):
    doc = trace_recommendations["plain"]
    evidence = doc["evidence"]
    assert set(evidence["engines"]) == {"vllm"}
    assert {e for e, _ in evidence["engine_notes"]} == {"vllm"}
    knobs = {k["name"] for k in evidence["knobs"]}
    assert "cpu_tier_bytes" in knobs
    assert not knobs & {"offload_min_priority", "retention_priorities"}
    assert "offload_min_priority" not in doc["settings"]
    assert "retention_priorities" not in doc["settings"]
    for key in ("sweep", "token_range_priorities", "token_range_sweep"):
        assert not evidence.get(key)


def test_a_model_near_chance_is_flagged_and_sets_no_threshold():
    card = gate._card({"held_out": {"rows": 500, "positive_rate": 0.4, "brier": 0.24,
                                    "roc_auc": 0.53}, "features": ["depth"], "config": {}})
    assert card.weak and "0.530" in card.weak
    sure = gate._card({"held_out": {"rows": 500, "positive_rate": 0.4, "brier": 0.1,
                                    "roc_auc": 0.8}, "features": ["depth"], "config": {}})
    assert sure.weak is None
    points = [gate.SweepPoint(t, "ge", 0.5, 1000 - t, 10) for t in (0, 30, 60)]
    chosen = gate._weak_pick(card.weak)(points, "ge")
    assert chosen.min_priority == 0 and "too near chance" in chosen.note
    assert gate.best(points, "ge").min_priority == 60  # what the sweep alone would pick
