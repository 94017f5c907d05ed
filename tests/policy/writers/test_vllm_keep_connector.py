"""The vLLM writer keeps the engine whole: a config that loads kvtier's recording connector
and spec keeps them (classes, module paths, ``kvtier_*`` keys, KV-events endpoints) and only
its offload settings change; rolling the CPU tier back to zero keeps them loaded; a config
that would not boot is never written."""

from __future__ import annotations

import difflib
import json

import pytest

from kvtier.policy.writers import vllm
from kvtier.policy.writers.settings import EngineSettings
from kvtier.policy.writers.vllm_shape import ShapeError, check
from kvtier.policy.writers.yamledit import ConfigFileError, yaml_get

GiB = 1 << 30
KVTIER_SERVE = """\
# fleet A, recorded by kvtier
model: m
kv-transfer-config:
  kv_connector: KvtierOffloadingConnector
  kv_connector_module_path: kvtier.probes.vllm.connector
  kv_role: kv_both
  kv_connector_extra_config:
    spec_name: KvtierCPUOffloadingSpec
    spec_module_path: kvtier.probes.vllm.spec
    cpu_bytes_to_use: 1073741824
    eviction_policy: lru
    kvtier_collector: tcp://10.0.0.5:6000
    kvtier_instance: node-7
    kvtier_ship_interval_s: 0.5
kv-events-config: '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:7001", "replay_endpoint": "tcp://*:7002", "topic": "a"}'
"""
KVTIER_JSON = {
    "kv_connector": "KvtierOffloadingConnector", "kv_connector_module_path": "kvtier.probes.vllm.connector",
    "kv_role": "kv_both", "engine_id": "e1",
    "kv_connector_extra_config": {"spec_name": "KvtierCPUOffloadingSpec",
                                  "spec_module_path": "kvtier.probes.vllm.spec",
                                  "cpu_bytes_to_use": GiB, "kvtier_collector": "tcp://10.0.0.5:6000"}}


def changed_lines(old: str, new: str) -> list[str]:
    return [l for l in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="")
            if l[:1] in "+-" and not l.startswith(("+++", "---"))]


def transfer_of(text: str) -> dict:
    return yaml_get(text, ("kv-transfer-config",))


def test_a_kvtier_serve_yaml_keeps_everything_but_size_and_policy():
    settings = EngineSettings(cpu_tier_bytes=4 * GiB, eviction_policy="arc", kv_events=True)
    out = vllm.render(settings, KVTIER_SERVE, ".yaml").text
    assert changed_lines(KVTIER_SERVE, out) == [
        "-    cpu_bytes_to_use: 1073741824", "-    eviction_policy: lru",
        "+    cpu_bytes_to_use: 4294967296", "+    eviction_policy: arc"]
    assert vllm.render(settings, out, ".yaml").text == out  # a second push changes nothing


def test_turning_events_off_keeps_the_endpoints():
    out = vllm.render(EngineSettings(cpu_tier_bytes=GiB, kv_events=False), KVTIER_SERVE, ".yaml").text
    assert json.loads(yaml_get(out, ("kv-events-config",))) == {
        "enable_kv_cache_events": False, "publisher": "zmq", "endpoint": "tcp://*:7001",
        "replay_endpoint": "tcp://*:7002", "topic": "a"}


def test_no_endpoint_is_ever_invented():
    on = EngineSettings(cpu_tier_bytes=GiB, kv_events=True)
    yaml_out = vllm.render(on, "model: m\n", ".yaml")
    assert yaml_get(yaml_out.text, ("kv-events-config",)) is None  # events left absent
    assert [n for n in yaml_out.notes if "kv-events-config" in n] == [
        f"kv_events: the file has no kv-events-config, none added; add {vllm.EVENTS_LINE}"]
    json_out = vllm.render(on, None, ".json")
    assert "tcp://" not in json_out.text + " ".join(json_out.notes)
    assert any(vllm.EVENTS_LINE in n for n in json_out.notes)
    off = vllm.render(EngineSettings(cpu_tier_bytes=GiB, kv_events=False), "model: m\n", ".yaml")
    assert yaml_get(off.text, ("kv-events-config",)) is None
    assert not [n for n in off.notes if "kv-events-config" in n]
    null = 'model: m\nkv-events-config: \'{"publisher": "null"}\'\n'
    assert json.loads(yaml_get(vllm.render(on, null, ".yaml").text, ("kv-events-config",))) == {
        "publisher": "zmq", "enable_kv_cache_events": True}


@pytest.mark.parametrize("suffix, text", [
    (".yaml", KVTIER_SERVE), (".json", json.dumps(KVTIER_JSON))])
def test_rolling_back_to_no_cpu_tier_keeps_the_connector_and_spec_recording(suffix, text):
    rendered = vllm.render(EngineSettings(cpu_tier_bytes=0), text, suffix)
    before = transfer_of(text) if suffix == ".yaml" else json.loads(text)
    after = transfer_of(rendered.text) if suffix == ".yaml" else json.loads(rendered.text)
    assert after["kv_connector_extra_config"]["cpu_bytes_to_use"] == vllm.ZERO_CPU_BYTES == 1
    after["kv_connector_extra_config"]["cpu_bytes_to_use"] = before["kv_connector_extra_config"]["cpu_bytes_to_use"]
    assert after == before  # connector, module paths, spec and kvtier_* keys as they were
    assert any("kvtier's plug-ins keep recording" in n for n in rendered.notes)
    if suffix == ".yaml":
        assert changed_lines(text, rendered.text) == ["-    cpu_bytes_to_use: 1073741824",
                                                      "+    cpu_bytes_to_use: 1"]


def test_a_cold_tier_moves_within_kvtiers_spec_family_and_back():
    cold = EngineSettings(cpu_tier_bytes=2 * GiB, cold_tier_path="/mnt/kv", cold_tier_bytes=8 * GiB)
    two = vllm.transfer_config(cold, KVTIER_JSON)
    extra = two["kv_connector_extra_config"]
    assert (extra["spec_name"], extra["spec_module_path"]) == ("KvtierTieringOffloadingSpec",
                                                               "kvtier.probes.vllm.spec")
    assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": "/mnt/kv", "enable_kv_events": True}]
    one = vllm.transfer_config(EngineSettings(cold_tier_bytes=0), two)
    assert one["kv_connector_extra_config"] == dict(KVTIER_JSON["kv_connector_extra_config"],
                                                    cpu_bytes_to_use=2 * GiB)
    zero = vllm.transfer_config(EngineSettings(cpu_tier_bytes=0), two)  # the cold tier goes too
    assert zero["kv_connector_extra_config"]["spec_name"] == "KvtierCPUOffloadingSpec"
    assert "secondary_tiers" not in zero["kv_connector_extra_config"]


def test_a_spec_kvtier_does_not_know_is_not_switched_to_a_tiering_one():
    custom = dict(KVTIER_JSON, kv_connector_extra_config={
        "spec_name": "MySpec", "spec_module_path": "mine.spec", "cpu_bytes_to_use": GiB})
    assert vllm.transfer_config(EngineSettings(cpu_tier_bytes=2 * GiB), custom)[
        "kv_connector_extra_config"]["spec_name"] == "MySpec"  # no tier change: kept
    with pytest.raises(ConfigFileError, match="change the tiers by hand"):
        vllm.transfer_config(EngineSettings(cpu_tier_bytes=GiB, cold_tier_path="/d", cold_tier_bytes=GiB),
                             custom)


@pytest.mark.parametrize("connector", [
    {"kv_connector": "LMCacheConnectorV1"},
    {"kv_connector": "OffloadingConnector", "kv_connector_module_path": "kvtier.probes.vllm.connector"},
    {"kv_connector": "KvtierOffloadingConnector"},  # no module path: vLLM cannot find it
])
def test_another_connector_is_refused_unless_forced(connector):
    existing = {**connector, "kv_role": "kv_both", "kv_connector_extra_config": {"keep": 1}}
    settings = EngineSettings(cpu_tier_bytes=GiB)
    with pytest.raises(ConfigFileError, match="add --force"):
        vllm.transfer_config(settings, existing)
    forced = vllm.transfer_config(settings, existing, force=True)
    assert forced == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"keep": 1, "cpu_bytes_to_use": GiB}}


def test_the_shape_check_refuses_what_would_not_boot():
    good = vllm.transfer_config(EngineSettings(cpu_tier_bytes=GiB), KVTIER_JSON)
    check(good, {"enable_kv_cache_events": True})
    broken = [
        (dict(good, kv_connector="OffloadingConnector"), "is not in kvtier.probes.vllm.connector"),
        (dict(good, kv_role="both"), "kv_role"),
        (dict(good, kv_connector_extra_config=dict(good["kv_connector_extra_config"],
                                                   spec_name="CPUOffloadingSpec")),
         "is not in kvtier.probes.vllm.spec"),
        (dict(good, kv_connector_extra_config={"spec_name": "MySpec", "cpu_bytes_to_use": 1}),
         "no spec_module_path"),
        (dict(good, kv_connector_extra_config={"cpu_bytes_to_use": 0}), "cpu_bytes_to_use"),
        (dict(good, kv_connector_extra_config={"spec_name": "TieringOffloadingSpec",
                                               "cpu_bytes_to_use": 1, "store_threshold": 2}),
         "store_threshold=2"),
    ]
    for config, says in broken:
        with pytest.raises(ShapeError, match=says):
            check(config)
    with pytest.raises(ShapeError, match="publisher"):
        check(good, {"enable_kv_cache_events": True, "publisher": "kafka"})


def test_extra_config_that_is_not_a_mapping_is_named():
    existing = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": "cpu_bytes_to_use=5"}
    with pytest.raises(ConfigFileError, match="kv_connector_extra_config must be a mapping .* got str"):
        vllm.transfer_config(EngineSettings(cpu_tier_bytes=GiB), existing)


def test_an_empty_json_file_is_refused():
    with pytest.raises(ConfigFileError, match="the file is empty"):
        vllm.render(EngineSettings(cpu_tier_bytes=GiB), "  \n", ".json")


def test_the_gpu_filter_is_written_for_kvtiers_connector_and_zero_removes_it():
    extra = "kv_connector_extra_config"
    filtered = EngineSettings(cpu_tier_bytes=GiB, gpu_sightings=2)
    fresh = vllm.transfer_config(filtered)  # a new file: the connector that reads the key
    assert (fresh["kv_connector"], fresh["kv_connector_module_path"]) == (
        "KvtierOffloadingConnector", "kvtier.probes.vllm.connector")
    assert fresh[extra]["kvtier_gpu_sightings"] == 2
    check(fresh)
    pushed = vllm.transfer_config(filtered, KVTIER_JSON)
    assert pushed[extra]["kvtier_gpu_sightings"] == 2
    assert pushed[extra]["kvtier_collector"] == "tcp://10.0.0.5:6000"
    # a recommendation without it leaves the file's; one that turns it off removes it
    assert vllm.transfer_config(EngineSettings(cpu_tier_bytes=GiB), pushed)[extra][
        "kvtier_gpu_sightings"] == 2
    assert "kvtier_gpu_sightings" not in vllm.transfer_config(
        EngineSettings(cpu_tier_bytes=GiB, gpu_sightings=0), pushed)[extra]
    # vLLM's own connector would ignore the key: refused, with the change to make
    native = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
              extra: {"cpu_bytes_to_use": GiB}}
    with pytest.raises(ConfigFileError, match="needs kvtier's connector.*kv_connector_module_path"):
        vllm.transfer_config(filtered, native)
    assert "kvtier_gpu_sightings" not in vllm.transfer_config(
        EngineSettings(cpu_tier_bytes=GiB, gpu_sightings=0), native)[extra]
