"""Each engine writer: the documented knobs, the guardrails on values, merge into a file."""

from __future__ import annotations

import json

import pytest

from kvtier.policy.writers import trtllm, writer
from kvtier.policy.writers.settings import EngineSettings, Guardrails
from kvtier.policy.writers.textedit import env_get
from kvtier.policy.writers.yamledit import yaml_get
from tests.policy.writers.args_file import args_get

GiB = 1 << 30


def render(engine, settings, existing=None, suffix=None):
    module = writer(engine)
    return module.render(settings, existing, suffix or module.FORMATS[0])


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize("kwargs, message", [
    (dict(cpu_tier_bytes=-1), "cpu_tier_bytes must be an int >= 0"),
    (dict(offload_min_priority=101), "0..100"),
    (dict(retention_priorities=(50, -3)), "0..100"),
    (dict(store_threshold=1), "0 .store always. or >= 2"),
    (dict(eviction_policy="random"), "not one of lru, arc"),
    (dict(cold_tier_bytes=5), "needs cold_tier_path"),
    (dict(cold_tier_path="relative/dir"), "absolute path"),
    (dict(kv_events="yes"), "true or false"),
    (dict(cpu_tier_bytes=True), "int >= 0"),
])
def test_settings_refuse_bad_values_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineSettings(**kwargs)


def test_settings_from_json_refuse_unknown_keys():
    assert EngineSettings.from_mapping({"cpu_tier_bytes": 4}).cpu_tier_bytes == 4
    with pytest.raises(ValueError, match="unknown setting.s. gpu_bytes; known: block_size"):
        EngineSettings.from_mapping({"gpu_bytes": 1})


def test_headroom_guardrail():
    assert Guardrails(host_headroom_bytes=8 * GiB).violations(EngineSettings(cpu_tier_bytes=4 * GiB)) == []
    (why,) = Guardrails(host_headroom_bytes=GiB).violations(EngineSettings(cpu_tier_bytes=4 * GiB))
    assert "exceeds the measured host headroom" in why


# ---------------------------------------------------------------- vLLM


def test_vllm_cpu_tier_json_merges_into_existing_connector_config():
    existing = json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                           "engine_id": "e1", "kv_connector_extra_config": {"block_size": 32}})
    out = json.loads(render("vllm", EngineSettings(cpu_tier_bytes=10 * GiB, eviction_policy="arc",
                                                   store_threshold=2), existing).text)
    assert out == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "engine_id": "e1",
                   "kv_connector_extra_config": {"block_size": 32, "cpu_bytes_to_use": 10 * GiB,
                                                 "eviction_policy": "arc", "store_threshold": 2}}


def test_vllm_cold_tier_uses_tiering_spec_and_rollback_removes_it():
    on = EngineSettings(cpu_tier_bytes=10 * GiB, cold_tier_path="/mnt/kv", cold_tier_bytes=GiB)
    first = render("vllm", on)
    extra = json.loads(first.text)["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": "/mnt/kv", "enable_kv_events": True}]
    assert any("no capacity limit" in n for n in first.notes)
    off = json.loads(render("vllm", EngineSettings(cold_tier_bytes=0), first.text).text)
    assert off["kv_connector_extra_config"] == {"cpu_bytes_to_use": 10 * GiB,
                                                "spec_name": "CPUOffloadingSpec"}


@pytest.mark.parametrize("settings, message", [
    (EngineSettings(cpu_tier_bytes=GiB, eviction_policy="lfu"), "not one of lru, arc"),
    (EngineSettings(cpu_tier_bytes=GiB, cold_tier_path="/d", store_threshold=3), "TieringOffloadingSpec"),
    (EngineSettings(cpu_tier_bytes=0, cold_tier_path="/d", cold_tier_bytes=GiB),
     "secondary tiers sit behind the CPU tier"),
    (EngineSettings(eviction_policy="arc"), "needs cpu_tier_bytes"),
])
def test_vllm_refusals(settings, message):
    with pytest.raises(ValueError, match=message):
        render("vllm", settings)


def test_vllm_yaml_config_file():
    text = render("vllm", EngineSettings(cpu_tier_bytes=8 * GiB, kv_events=True),
                  "model: m\nblock-size: 16\n", ".yaml").text
    assert yaml_get(text, ("model",)) == "m"
    assert json.loads(yaml_get(text, ("kv-transfer-config",)))["kv_connector_extra_config"] == {
        "cpu_bytes_to_use": 8 * GiB}
    assert yaml_get(text, ("kv-events-config",)) is None  # no endpoint to keep: none invented


# ---------------------------------------------------------------- TensorRT-LLM


@pytest.mark.parametrize("min_priority, classes, threshold, offloaded", [
    (50, (), 50, []),              # only the default 35 is in use: nothing offloaded
    (35, (), 34, [35]),            # 35 itself would split the rules: > 35 vs >= 35
    (50, (80, 20), 50, [80]),
    (30, (80, 20), 30, [35, 80]),
    (21, (80, 20), 21, [35, 80]),
    (0, (), 0, [35]),
    (36, (36,), None, None),       # 35 and 36 are adjacent: no common threshold
])
def test_trtllm_threshold_means_the_same_under_both_rules(min_priority, classes, threshold, offloaded):
    if threshold is None:
        with pytest.raises(ValueError, match="adjacent"):
            trtllm.offload_threshold(min_priority, classes)
        return
    t, got_offloaded, kept = trtllm.offload_threshold(min_priority, classes)
    in_use = set(classes) | {35}
    assert {p for p in in_use if p > t} == {p for p in in_use if p >= t} == set(got_offloaded)
    assert {p for p in in_use if p >= min_priority} == set(got_offloaded)
    assert sorted(kept + got_offloaded) == sorted(in_use)
    assert (t, got_offloaded) == (threshold, offloaded)


def test_trtllm_yaml():
    settings = EngineSettings(cpu_tier_bytes=64 * GiB, ranks=2, offload_min_priority=50,
                              retention_priorities=(80,), kv_events=True, block_size_tokens=32)
    out = render("trtllm", settings, "kv_cache_config:\n  free_gpu_memory_fraction: 0.85\n")
    get = lambda key: yaml_get(out.text, ("kv_cache_config", key))
    assert (get("host_cache_size"), get("secondary_offload_min_priority"),
            get("event_buffer_max_size"), get("tokens_per_block"), get("enable_block_reuse"),
            get("free_gpu_memory_fraction")) == (32 * GiB, 50, 16384, 32, True, 0.85)
    assert yaml_get(out.text, ("enable_iter_perf_stats",)) is True
    assert any("documented rule (priority > 50) and the coded rule (priority >= 50)" in n
               for n in out.notes)
    with pytest.raises(ValueError, match="priority then LRU"):
        render("trtllm", EngineSettings(eviction_policy="arc"))


def test_trtllm_retention_json():
    data = json.loads(trtllm.retention_json({"chat": 80, "batch": 10}, {"chat": 60000}))
    assert data["chat"]["token_range_retention_configs"] == [
        {"token_start": 0, "token_end": None, "priority": 80, "duration_ms": 60000}]
    with pytest.raises(ValueError, match="0..100"):
        trtllm.retention_json({"x": 200})


# ---------------------------------------------------------------- LMCache, SGLang, Dynamo


def test_lmcache_yaml():
    out = render("lmcache", EngineSettings(cpu_tier_bytes=int(5.5 * GiB), cold_tier_path="/ssd",
                                           cold_tier_bytes=100 * GiB, eviction_policy="lfu",
                                           save_priority_limit=5), "chunk_size: 256\n").text
    assert [yaml_get(out, (k,)) for k in ("chunk_size", "local_cpu", "max_local_cpu_size",
                                         "local_disk", "max_local_disk_size", "cache_policy",
                                         "priority_limit")] == [
        256, True, 5.5, "file:///ssd/", 100.0, "LFU", 5]
    with pytest.raises(ValueError, match="not one of lru, lfu, fifo"):
        render("lmcache", EngineSettings(eviction_policy="arc"))


def test_sglang_args():
    out = render("sglang", EngineSettings(cpu_tier_bytes=64 * GiB, ranks=4, write_policy="write_back",
                                          eviction_policy="priority"),
                 "--model-path M\n--hicache-ratio 2\n").text
    assert args_get(out, "--hicache-ratio") is None and args_get(out, "--hicache-size") == "16"
    assert args_get(out, "--enable-hierarchical-cache") is True
    assert args_get(out, "--radix-eviction-policy") == "priority"
    off = render("sglang", EngineSettings(cpu_tier_bytes=0), out).text
    assert args_get(off, "--enable-hierarchical-cache") is None and args_get(off, "--hicache-size") is None
    with pytest.raises(ValueError, match="whole GB per rank"):
        render("sglang", EngineSettings(cpu_tier_bytes=GiB, ranks=2))


def test_dynamo_env():
    out = render("dynamo", EngineSettings(cpu_tier_bytes=16 * GiB, cold_tier_bytes=200 * GiB,
                                          cold_tier_path="/nvme", offload_min_priority=40)).text
    assert [env_get(out, k) for k in ("DYN_KVBM_CPU_CACHE_GB", "DYN_KVBM_DISK_CACHE_GB",
                                      "DYN_KVBM_DISK_CACHE_DIR",
                                      "DYN_KVBM_HOST_OFFLOAD_PREFIX_MIN_PRIORITY")] == [
        "16.0", "200.0", "/nvme", "40"]
    with pytest.raises(ValueError, match="needs a CPU tier"):
        render("dynamo", EngineSettings(cpu_tier_bytes=0, cold_tier_bytes=GiB, cold_tier_path="/x"))


def test_unknown_engine_and_wrong_file_kind():
    with pytest.raises(ValueError, match="known: vllm, trtllm"):
        writer("ollama")
    with pytest.raises(ValueError, match=r"\.yaml"):
        render("trtllm", EngineSettings(), suffix=".toml")


def test_trtllm_retention_file_for_the_gateway_and_threshold_between_classes():
    settings = EngineSettings.from_mapping({"retention_classes": {"chat": 80, "batch": 10},
                                            "offload_min_priority": 50})
    assert settings.priorities_in_use == (10, 80)
    existing = json.dumps({"legacy": {"decode_retention_priority": 35}})
    out = render("trtllm", settings, existing, ".json")
    data = json.loads(out.text)
    assert set(data) == {"legacy", "chat", "batch"}
    assert data["chat"]["token_range_retention_configs"][0]["priority"] == 80
    yaml_text = render("trtllm", settings).text
    assert yaml_get(yaml_text, ("kv_cache_config", "secondary_offload_min_priority")) == 50
    with pytest.raises(ValueError, match="no retention_classes"):
        render("trtllm", EngineSettings(), None, ".json")
    with pytest.raises(ValueError, match="retention_classes"):
        EngineSettings(retention_classes={"x": 101})


RANGES = {"chat": {"token_range_retention_configs": [
    {"token_start": 0, "token_end": 512, "priority": 80, "duration_ms": None},
    {"token_start": 512, "token_end": None, "priority": 20, "duration_ms": 60000}],
    "decode_retention_priority": 20, "decode_duration_ms": None}}


def test_trtllm_token_range_retention_goes_to_the_gateway_file_in_llm_api_keywords():
    settings = EngineSettings.from_mapping({"retention_ranges": RANGES, "offload_min_priority": 50})
    # the ranges' priorities and the default 35 are in use: 50 sits between 35 and 80
    assert settings.priorities_in_use == (20, 80)
    existing = json.dumps({"legacy": {"decode_retention_priority": 35}})
    data = json.loads(render("trtllm", settings, existing, ".json").text)
    assert data == {"legacy": {"decode_retention_priority": 35}, **RANGES}
    yaml_out = render("trtllm", settings)
    assert yaml_get(yaml_out.text, ("kv_cache_config", "secondary_offload_min_priority")) == 50
    assert "token_range" not in yaml_out.text
    assert any("gateway" in n for n in yaml_out.notes)


def test_trtllm_threshold_accounts_for_range_priorities():
    # a range at 49 kept, decode at 50 offloaded: no value means the same under > and >=
    ranges = {"c": {"token_range_retention_configs": [
        {"token_start": 0, "token_end": None, "priority": 49, "duration_ms": None}],
        "decode_retention_priority": 50}}
    with pytest.raises(ValueError, match="adjacent"):
        render("trtllm", EngineSettings(retention_ranges=ranges, offload_min_priority=50))


@pytest.mark.parametrize("ranges, message", [
    ([{"token_start": 0, "token_end": 512, "priority": 80},
      {"token_start": 256, "token_end": None, "priority": 20}], "not overlap"),
    ([{"token_start": 0, "token_end": None, "priority": 80},
      {"token_start": 512, "token_end": None, "priority": 20}], "not overlap"),
    ([{"token_start": 0, "token_end": 512, "priority": 101}], "priority must be an int in 0..100"),
    ([{"token_start": 512, "token_end": 512, "priority": 1}], "token_end must be an int >= 513"),
    ([], "no token ranges"),
    ([{"token_start": 0, "end": 5, "priority": 1}], "bad token range"),
])
def test_retention_ranges_refuse_what_trtllm_refuses(ranges, message):
    with pytest.raises(ValueError, match=message):
        EngineSettings.from_mapping({"retention_ranges": {"c": {
            "token_range_retention_configs": ranges}}})


def test_a_class_cannot_be_both_whole_prompt_and_ranged():
    with pytest.raises(ValueError, match="both retention_classes and retention_ranges"):
        EngineSettings.from_mapping({"retention_classes": {"chat": 80}, "retention_ranges": RANGES})


@pytest.mark.parametrize("engine", ["trtllm", "lmcache", "sglang", "dynamo"])
def test_the_gpu_prefix_cache_filter_is_vllms_alone(engine):
    with pytest.raises(ValueError, match="gpu_sightings"):
        writer(engine).validate(EngineSettings(cpu_tier_bytes=1 << 30, gpu_sightings=2))
    writer(engine).validate(EngineSettings(cpu_tier_bytes=1 << 30, gpu_sightings=0))


def test_every_engine_but_vllm_says_it_cannot_filter_the_gpu_prefix_cache():
    from kvtier.policy.writers.choices import Choices

    choices = Choices(cpu_tier_bytes=1 << 30, min_priority=30, gpu_sightings=2)
    for engine, name in (("trtllm", "TensorRT-LLM"), ("lmcache", "LMCache"),
                         ("sglang", "SGLang"), ("dynamo", "Dynamo KVBM")):
        settings, notes = writer(engine).recommended(choices)
        assert settings.gpu_sightings is None
        assert any(f"which {name} cannot express" in note for note in notes), notes
        _, plain = writer(engine).recommended(Choices(cpu_tier_bytes=1 << 30, min_priority=30))
        assert not any("GPU prefix cache" in note for note in plain)
