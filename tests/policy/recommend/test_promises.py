"""Did a recommendation keep its promises? ``check_promises`` on narrated scenarios, and
``kvtier recommend --check`` on a store: too few requests under the new tier configuration
(exit 3, how many more), every prediction held (exit 0), a hit ratio off by more than the
tolerance (exit 4). Also: recommend reads the GPU capacity vLLM published into the store."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import MetricInterval, Origin, RequestRecord
from kvtier.collector.store import TraceStore
from kvtier.policy.recommend.promises import check_promises
from kvtier.policy.recommend.recommendation import Recommendation
from kvtier.policy.recommend.values import Change, Evidence, HitRatios, HostCheck, Verdict
from kvtier.policy.writers.settings import EngineSettings
from kvtier.verbs import recommend as recommend_verb
from tests.policy.recommend.test_engine_inputs import BLOCK_TOKENS, vllm_like_store

VLLM = EngineSettings(cpu_tier_bytes=2 << 20, eviction_policy="lru", store_threshold=0)
LMCACHE = EngineSettings(cpu_tier_bytes=1 << 20, eviction_policy="lru")
DYNAMO = EngineSettings(cpu_tier_bytes=1 << 20, offload_min_priority=40)


def recommendation(train: int = 10, evaluated: int = 10) -> Recommendation:
    """Predicts a 0.60 hit ratio with the CPU tier admitting all (0.70 with the learned
    gate, 0.55 for vLLM), TTFT p50 0.10 s in [0.09, 0.12] and p99 0.30 s in [0.25, 0.35]
    admitting all."""
    admit_all = (Change("ttft_p50_s", 0.20, 0.10, -0.10, -0.11, -0.08),
                 Change("ttft_p99_s", 0.50, 0.30, -0.20, -0.25, -0.15))
    evidence = Evidence(Verdict("offload"), HostCheck(False), HitRatios(0.30, 0.60, 0.70, 0.55),
                        train_requests=train, evaluated_requests=evaluated,
                        expected_vs_gpu_only=(Change("ttft_p50_s", 0.2, 0.05, -0.15, -0.2, -0.1),),
                        expected_admit_all_vs_gpu_only=admit_all,
                        expected_vllm_vs_gpu_only=admit_all[:1])
    return Recommendation(Verdict("offload"), EngineSettings(cpu_tier_bytes=1 << 20), evidence,
                          engine_settings=(("vllm", VLLM), ("lmcache", LMCACHE),
                                           ("dynamo", DYNAMO)))


def served(n: int, hit_ratio: float, ttft_s: float = 0.1, config: str = "gpu+cpu:1048576",
           start_s: float = 0.0) -> list[RequestRecord]:
    """``n`` requests of 100 prompt tokens, ``hit_ratio`` of them served from the tiers."""
    hits = round(100 * hit_ratio)
    return [RequestRecord(f"r{i}", start_s + i, 100, 4, gpu_hit_tokens=hits // 2,
                          cpu_promotion_tokens=hits - hits // 2, cold_promotion_tokens=0,
                          recomputed_tokens=100 - hits, ttft_s=ttft_s, tier_config_id=config)
            for i in range(n)]


def by_metric(result) -> dict:
    return {p.metric: p for p in result.promises}


def test_too_few_requests_say_how_many_more_and_judge_nothing():
    result = check_promises(recommendation(), "lmcache", served(12, 0.6), "gpu+cpu:1048576")
    assert not result.enough and result.needed == 20 and result.more_needed == 8
    assert result.held is None


def test_the_warm_up_share_is_left_out_as_the_prediction_left_it_out():
    """20 requests, trained on 10 / measured on 10: the first 10 under the new configuration
    (cold tiers after the restart, hit ratio 0) are not judged; the last 10 hit 0.61."""
    records = served(10, 0.0) + served(10, 0.61, start_s=100)
    result = check_promises(recommendation(), "lmcache", records, "gpu+cpu:1048576")
    assert result.warmup == 10 and result.judged == 10
    hit = by_metric(result)["token_hit_ratio"]
    assert (hit.predicted, hit.measured) == (0.60, pytest.approx(0.61)) and hit.held
    assert result.basis == "the CPU tier admitting every block (LRU)"


def test_ttft_percentiles_are_judged_against_their_intervals():
    result = check_promises(recommendation(), "lmcache", served(20, 0.6, ttft_s=0.3), "c")
    promises = by_metric(result)
    assert (promises["ttft_p50_s"].low, promises["ttft_p50_s"].high) == pytest.approx((0.09, 0.12))
    assert promises["ttft_p50_s"].measured == pytest.approx(0.3)
    assert promises["ttft_p50_s"].held is False and promises["ttft_p99_s"].held is True
    assert result.held is False


def test_an_engine_that_gates_by_priority_is_held_to_the_learned_prediction():
    result = check_promises(recommendation(), "dynamo", served(20, 0.6), "c")
    assert by_metric(result)["token_hit_ratio"].predicted == 0.70
    assert by_metric(result)["token_hit_ratio"].held is False  # 10 points off
    assert set(by_metric(result)) == {"token_hit_ratio", "ttft_p50_s"}


def test_vllm_is_held_to_its_own_semantics():
    result = check_promises(recommendation(), "vllm", served(20, 0.56), "c")
    assert by_metric(result)["token_hit_ratio"].predicted == 0.55
    assert by_metric(result)["token_hit_ratio"].held is True
    assert "vLLM's CPU tier of 2097152 bytes (lru, store_threshold 0)" in result.basis


def test_without_ttft_only_the_hit_ratio_is_judged():
    records = [dataclasses.replace(r, ttft_s=None) for r in served(20, 0.59)]
    result = check_promises(recommendation(), "lmcache", records, "c", tolerance_points=1.0)
    assert by_metric(result)["ttft_p50_s"].held is None and result.held is True


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="min_requests"):
        check_promises(recommendation(), "vllm", [], "c", min_requests=0)


# ------------------------------------------------------------------ the command line, on a store

def run(argv) -> int:
    parser = argparse.ArgumentParser()
    recommend_verb.add_arguments(parser)
    return recommend_verb.run(parser.parse_args(argv))


def add_metrics(store_path, num_gpu_blocks: int) -> None:
    labels = f'block_size="{BLOCK_TOKENS}",engine="0",num_gpu_blocks="{num_gpu_blocks}"'
    with TraceStore(store_path) as store:
        store.ingest(EventBatch.from_intervals(Origin("vllm", "node-1", "node-1/scrape"), 1, [
            MetricInterval(10.0, 20.0, "vllm:cache_config_info", "gauge", 1.0, labels)]))


@pytest.fixture(scope="module")
def recommended(tmp_path_factory):
    """A vLLM store (300 requests) whose collector scraped vLLM's cache geometry, and the
    recommendation made from it with no capacity flag."""
    root = tmp_path_factory.mktemp("check")
    store = vllm_like_store(root / "kvtier.duckdb")
    add_metrics(store, 31)
    assert run(["--store", str(store), "--engine", "vllm", "--host-headroom-bytes", str(1 << 40),
                "--out", str(root / "reco")]) == 0
    doc = json.loads((root / "reco" / "recommendation.json").read_text())
    return store, root / "reco" / "recommendation.json", doc


def test_recommend_takes_the_gpu_capacity_vllm_published(recommended):
    _, _, doc = recommended
    inputs = {i["name"]: i for i in doc["evidence"]["inputs"]}
    assert inputs["gpu_tokens"]["source"] == "measured"
    assert inputs["gpu_tokens"]["value"] == 30 * BLOCK_TOKENS  # 31 blocks less the null block
    assert doc["evidence"]["tiers_blocks"]["gpu"] == 30


def phase_two(store, doc, hit_ratio: float, n: int) -> str:
    """``n`` requests served under the pushed configuration; its tier configuration."""
    config = f"gpu+cpu:{doc['evidence']['engines']['vllm']['cpu_tier_bytes']}"
    with TraceStore(store) as opened:
        opened.ingest(EventBatch.from_rows(Origin("vllm", "node-1", "node-1/phase-2"), 1, [],
                                           served(n, hit_ratio, config=config, start_s=1e6)))
    return config


def test_recommend_check_waits_then_judges(recommended, tmp_path, capsys):
    store, reco, doc = recommended
    copy = tmp_path / "kvtier.duckdb"
    copy.write_bytes(store.read_bytes())
    ratio = doc["evidence"]["token_hit_ratio"]["vllm"]
    needed = doc["evidence"]["train_requests"] + doc["evidence"]["evaluated_requests"]
    config = phase_two(copy, doc, ratio, 10)
    capsys.readouterr()
    assert run(["--check", str(reco), "--store", str(copy)]) == 3
    out = capsys.readouterr().out
    assert f"needs {needed - 10} more requests under {config}" in out
    with TraceStore(copy) as opened:  # the rest arrive
        opened.ingest(EventBatch.from_rows(Origin("vllm", "node-1", "node-1/phase-2b"), 1, [], [
            dataclasses.replace(r, request_id=f"late-{r.request_id}", arrival_s=r.arrival_s + 1e5)
            for r in served(needed, ratio, ttft_s=None, config=config, start_s=1e6)]))
    assert run(["--check", str(reco), "--store", str(copy), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["tier_config"] == config and answer["held"] is True
    kept = json.loads(reco.with_name("recommendation.check.json").read_text())
    assert kept == answer  # beside the recommendation, for the collector and the dashboard
    assert answer["promises"][0]["metric"] == "token_hit_ratio"


def test_recommend_check_says_a_missed_hit_ratio(recommended, tmp_path, capsys):
    store, reco, doc = recommended
    copy = tmp_path / "kvtier.duckdb"
    copy.write_bytes(store.read_bytes())
    ratio = doc["evidence"]["token_hit_ratio"]["vllm"]
    phase_two(copy, doc, max(0.0, ratio - 0.1), 400)
    capsys.readouterr()
    assert run(["--check", str(reco), "--store", str(copy)]) == 4
    out = capsys.readouterr().out
    assert "OUTSIDE" in out and "not held: token_hit_ratio" in out


def test_vllms_cpu_tier_also_holds_the_gpus_copy(recommended):
    """vLLM writes every block through to its CPU tier: to hold the recommended blocks beyond
    the GPU (30 blocks) its CPU tier is 30 blocks larger, and its prediction is replayed so."""
    _, _, doc = recommended
    evidence = doc["evidence"]
    beyond = evidence["tiers_blocks"]["cpu"]
    assert evidence["engines"]["vllm"]["cpu_tier_bytes"] == (beyond + 30) * 65_536
    assert doc["settings"]["cpu_tier_bytes"] == beyond * 65_536
    assert evidence["token_hit_ratio"]["vllm"] is not None
    assert any("copy of the blocks" in note for engine, note in evidence["engine_notes"]
               if engine == "vllm")


def test_a_promised_improvement_is_judged_against_the_requests_as_served():
    """vLLM was promised TTFT p50 -30 ms [-40, -20] against the phase the recommendation was
    made from (served at 0.10 s); after the push the same traffic measures 0.105 s: the level
    may sit in its interval, but the change (+5 ms) is outside, and the check says the
    improvement did not materialise."""
    rec = recommendation()
    promised = Change("ttft_p50_s", 0.10, 0.07, -0.03, -0.04, -0.02, 0.09, 0.11, 0.06, 0.11)
    rec = dataclasses.replace(rec, evidence=dataclasses.replace(
        rec.evidence, expected_vs_served=(promised,), served_tier_config="gpu+cpu:small"))
    before = served(20, 0.5, ttft_s=0.10, config="gpu+cpu:small")
    after = served(20, 0.55, ttft_s=0.105, config="gpu+cpu:2097152", start_s=100)
    result = check_promises(rec, "vllm", after, "gpu+cpu:2097152", served=before)
    change = by_metric(result)["ttft_p50_s change"]
    assert change.measured == pytest.approx(0.005) and change.held is False
    assert result.served_tier_config == "gpu+cpu:small"
    from kvtier.policy.recommend.promises import improvement_words

    assert "did not materialise" in improvement_words(result)
    kept = check_promises(rec, "vllm", served(20, 0.55, ttft_s=0.072, config="x", start_s=100), "x",
                          served=before)
    assert by_metric(kept)["ttft_p50_s change"].held and improvement_words(kept) is None
    # without the requests as served, only the levels are judged
    assert "ttft_p50_s change" not in by_metric(check_promises(rec, "vllm", after, "gpu+cpu:2097152"))


def test_check_on_a_held_store_says_how_many_requests_its_segments_gave(recommended, tmp_path, capsys):
    """A running collector holds the store: --check reads the segments it exported and says
    how many requests they gave and how old the export is (what came since is not read)."""
    from kvtier.collector.segments import export_segments
    from tests.collector.calibration_store import hold

    store, reco, doc = recommended
    copy = tmp_path / "kvtier.duckdb"
    copy.write_bytes(store.read_bytes())
    config = phase_two(copy, doc, doc["evidence"]["token_hit_ratio"]["vllm"], 10)
    with TraceStore(copy) as writer:
        export_segments(writer, tmp_path / "segments")
    holder = hold(copy)
    try:
        capsys.readouterr()
        assert run(["--check", str(reco), "--store", str(copy)]) == 3
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert f"is held by process {holder.pid}" in err
    assert f"10 requests under {config} read from segments last exported" in err
    assert "check again after its next export" in err


def test_an_offload_recommendation_names_the_configuration_its_requests_were_served_under(tmp_path, capsys):
    """The store's requests were all served under one tier configuration, with no
    --tier-config given: an offload recommendation names it, promises each TTFT percentile's
    change against those requests (a calibrated prefill rate: the queue model), and --check
    judges each promised change against the change measured between the two phases."""
    store = vllm_like_store(tmp_path / "kvtier.duckdb", served_under="gpu+cpu:1048576")
    add_metrics(store, 31)
    costs = tmp_path / "cost.json"
    costs.write_text(json.dumps({"probe": "calibrate", "cost_params": {"prefill_tokens_per_s": 800.0}}))
    assert run(["--store", str(store), "--engine", "vllm", "--host-headroom-bytes", str(1 << 40),
                "--cost-params", str(costs), "--out", str(tmp_path / "reco")]) == 0
    reco = tmp_path / "reco" / "recommendation.json"
    evidence = json.loads(reco.read_text())["evidence"]
    assert (evidence["verdict"], evidence["latency_model"]["model"]) == ("offload", "queue")
    assert evidence["served_tier_config"] == "gpu+cpu:1048576"
    metrics = ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s")
    assert {c["metric"] for c in evidence["expected_vs_served"]} >= set(metrics)
    phase_two(store, {"evidence": evidence}, evidence["token_hit_ratio"]["vllm"], 300)
    capsys.readouterr()
    run(["--check", str(reco), "--store", str(store), "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert answer["served_tier_config"] == "gpu+cpu:1048576"
    changes = {p["metric"]: p for p in answer["promises"] if p["metric"].endswith(" change")}
    assert set(changes) == {f"{m} change" for m in metrics}
    assert all(p["measured"] is not None and p["low"] <= p["predicted"] <= p["high"]
               for p in changes.values())
