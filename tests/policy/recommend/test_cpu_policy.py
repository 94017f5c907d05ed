"""The recommendation's CPU tier admission and eviction, chosen together on the training period:
its evidence (a typed value, every candidate's validation figure), the report's sentence, and
what each engine takes of the same decision."""

from __future__ import annotations

import json

from kvtier.policy.recommend.build import Inputs, recommend
from kvtier.policy.recommend.headroom import from_bytes
from kvtier.policy.recommend.recommendation import from_json
from kvtier.policy.recommend.report import markdown
from kvtier.policy.recommend.values import CpuPolicy
from tests.policy.learn.test_pairs import each_prompt_asked_twice, hot_documents_in_a_flood

HOST = from_bytes(1 << 40)  # not this machine's memory: the same everywhere


def notes(rec, engine):
    return " ".join(n for e, n in rec.engine_notes if e == engine)


def test_the_sighting_filter_chosen_on_the_training_period_reaches_the_engines():
    rec = recommend(hot_documents_in_a_flood(), Inputs(gpu_blocks=6, cpu_blocks=30,
                                                       prefill_servers=2, host=HOST))
    policy = rec.evidence.cpu_policy
    assert isinstance(policy, CpuPolicy)
    assert (policy.admission, policy.min_sightings) == ("sightings", 2)
    assert policy.validation[0].pair == "admit all + LRU"
    chosen = next(v for v in policy.validation if v.pair == policy.pair)
    assert chosen.token_hit_ratio > policy.validation[0].token_hit_ratio
    assert policy.fit_requests + policy.validation_requests == rec.evidence.train_requests
    # the evidence survives the JSON the dashboard and push read
    again = from_json(json.loads(json.dumps(rec.to_json())))
    assert again.evidence.cpu_policy == policy
    report = markdown(rec, (), ("vllm", "trtllm", "dynamo"))
    assert f"## CPU tier admission and eviction\n\n{policy.why}" in report
    # vLLM: the filter is its store_threshold, replayed under its semantics beside none
    assert rec.for_engine("vllm").store_threshold == 2
    assert {s for s, _ in rec.evidence.vllm_cpu_setting_recomputed_tokens} == {
        "lru/store_threshold=0", "lru/store_threshold=2", "arc/store_threshold=0",
        "arc/store_threshold=2"}
    assert "min_lfu_count = 2" in notes(rec, "dynamo")
    assert "cannot take it" in notes(rec, "trtllm")


def test_a_plain_lru_choice_leaves_vllm_without_a_filter():
    rec = recommend(each_prompt_asked_twice(), Inputs(gpu_blocks=8, cpu_blocks=5000,
                                                      prefill_servers=2, host=HOST))
    assert rec.evidence.cpu_policy.pair == "admit all + LRU"
    assert rec.for_engine("vllm").store_threshold == 0
    assert {s for s, _ in rec.evidence.vllm_cpu_setting_recomputed_tokens} == {
        "lru/store_threshold=0", "arc/store_threshold=0"}
    assert "min_lfu_count" not in notes(rec, "dynamo")
