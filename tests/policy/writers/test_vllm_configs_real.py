"""Every vLLM config kvtier writes is accepted by vLLM's own code, and deliberately broken
ones are rejected (official vllm==0.33.0 wheel in the side environment; see
tests/probes/vllm/side_env.sh). YAML written for other engines is read back with PyYAML
from the same environment. Skipped where the side environment is missing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvtier.policy.recommend.recommendation import KIND, VERSION
from kvtier.policy.writers import writer
from kvtier.policy.writers.settings import EngineSettings

SIDE_PYTHON = os.environ.get("KVTIER_VLLM_PYTHON", "/tmp/kvt-vllm-side/bin/python")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180),
              pytest.mark.skipif(not Path(SIDE_PYTHON).exists(), reason="no vLLM side environment")]
GiB = 1 << 30
ROOT = Path(__file__).resolve().parents[3]


def side_check(cases: list[dict], **environment: str) -> list[dict]:
    script = Path(__file__).with_name("vllm_side_check.py")
    env = dict(os.environ, PYTHONPATH=str(ROOT), **environment)  # kvtier's plug-ins, as vLLM loads them
    done = subprocess.run([SIDE_PYTHON, str(script)], input=json.dumps(cases), text=True,
                          capture_output=True, timeout=170, env=env)
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def test_vllm_accepts_what_kvtier_writes_and_rejects_broken_configs(tmp_path):
    cold = tmp_path / "cold"
    cold.mkdir()
    good_settings = [
        EngineSettings(cpu_tier_bytes=10 * GiB),
        EngineSettings(cpu_tier_bytes=4 * GiB, eviction_policy="arc", store_threshold=2,
                       block_size_tokens=32),
        EngineSettings(cpu_tier_bytes=8 * GiB, eviction_policy="lru", cold_tier_path=str(cold),
                       cold_tier_bytes=100 * GiB),
    ]
    vllm = writer("vllm")
    good = [json.loads(vllm.render(s, None, ".json").text) for s in good_settings]
    yaml_path = tmp_path / "serve.yaml"
    yaml_path.write_text(vllm.render(EngineSettings(cpu_tier_bytes=2 * GiB, kv_events=True),
                                     "model: kvtier/check\nblock-size: 16\n", ".yaml").text)
    broken = [
        dict(good[0], kv_role="both"),
        dict(good[0], kv_connector_extra_config={"cpu_bytes_to_use": GiB, "eviction_policy": "mru"}),
        dict(good[2], kv_connector_extra_config=dict(good[2]["kv_connector_extra_config"],
                                                     store_threshold=3)),
        dict(good[0], kv_connector_extra_config={"eviction_policy": "lru"}),
    ]
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("model: kvtier/check\nkv-transfer-config: '{\"kv_role\": \"nope\"}'\n")
    cases = ([{"kind": "transfer", "config": c} for c in good + broken]
             + [{"kind": "yaml", "path": str(yaml_path)}, {"kind": "yaml", "path": str(bad_yaml)}])
    results = side_check(cases)
    oks = [r["ok"] for r in results]
    assert oks == [True] * 3 + [False] * 4 + [True, False], results
    errors = " | ".join(r.get("error", "") for r in results)
    for reason in ("kv_role", "Unknown cache policy", "store_threshold is not supported",
                   "cpu_bytes_to_use must be specified"):
        assert reason in errors
    # kvtier's own writer refuses the same broken values before vLLM would
    for settings in (dict(cpu_tier_bytes=GiB, eviction_policy="lfu"),
                     dict(cpu_tier_bytes=GiB, cold_tier_path=str(cold), store_threshold=3),
                     dict(eviction_policy="lru")):
        with pytest.raises(ValueError):
            vllm.render(EngineSettings(**settings), None, ".json")


def test_vllm_reads_one_value_from_a_pushed_yaml_whatever_the_key_spelling(tmp_path):
    """The file spells the flag with underscores, or writes it as a YAML mapping: the push
    edits that key in place (comments kept), and vLLM's own parser sees the pushed size."""
    vllm = writer("vllm")
    settings = EngineSettings(cpu_tier_bytes=3 * GiB, eviction_policy="arc")
    underscore = tmp_path / "underscore.yaml"
    underscore.write_text(vllm.render(settings, (
        "# chat fleet\nmodel: kvtier/check  # the model\n"
        "kv_transfer_config: '{\"kv_connector\": \"OffloadingConnector\", \"kv_role\": \"kv_both\", "
        "\"kv_connector_extra_config\": {\"cpu_bytes_to_use\": 1000000000}}'\n"), ".yaml").text)
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(vllm.render(settings, (
        "model: kvtier/check\nkv-transfer-config:\n  kv_connector: OffloadingConnector  # ours\n"
        "  kv_role: kv_both\n  kv_connector_extra_config:\n    cpu_bytes_to_use: 1000000000\n"),
        ".yaml").text)
    results = side_check([{"kind": "yaml", "path": str(p)} for p in (underscore, mapping)])
    assert [r["ok"] for r in results] == [True, True], results
    for result in results:
        assert result["extra"]["cpu_bytes_to_use"] == 3 * GiB and result["extra"]["eviction_policy"] == "arc"
    assert "kv-transfer-config" not in underscore.read_text() and "# the model" in underscore.read_text()
    assert "kv_connector: OffloadingConnector  # ours" in mapping.read_text()


def test_yaml_for_other_engines_reads_back_with_pyyaml(tmp_path):
    s = EngineSettings(cpu_tier_bytes=16 * GiB, cold_tier_path="/mnt/kv", cold_tier_bytes=GiB,
                       offload_min_priority=50, retention_priorities=(80,), kv_events=True)
    texts = {
        "trtllm": writer("trtllm").render(s, "backend: pytorch  # hi\nkv_cache_config:\n"
                                             "  free_gpu_memory_fraction: 0.9\n", ".yaml").text,
        "lmcache": writer("lmcache").render(EngineSettings(
            cpu_tier_bytes=5 * GiB, cold_tier_path="/mnt/kv", cold_tier_bytes=GiB,
            eviction_policy="lru"), "chunk_size: 256\n", ".yaml").text,
    }
    code = "import json,sys,yaml; print(json.dumps({k: yaml.safe_load(v) for k, v in json.load(sys.stdin).items()}))"
    done = subprocess.run([SIDE_PYTHON, "-c", code], input=json.dumps(texts), text=True,
                          capture_output=True, timeout=60)
    loaded = json.loads(done.stdout)
    assert loaded["trtllm"] == {
        "backend": "pytorch", "enable_iter_perf_stats": True,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True,
                            "host_cache_size": 16 * GiB, "secondary_offload_min_priority": 50,
                            "event_buffer_max_size": 16384, "disk_cache_size": GiB,
                            "disk_cache_path": "/mnt/kv"}}
    assert loaded["lmcache"] == {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 5.0,
                                 "local_disk": "file:///mnt/kv/", "max_local_disk_size": 1.0,
                                 "cache_policy": "LRU"}


KVTIER_SERVE = """\
model: kvtier/check
kv-transfer-config:
  kv_connector: KvtierOffloadingConnector
  kv_connector_module_path: kvtier.probes.vllm.connector
  kv_role: kv_both
  kv_connector_extra_config:
    spec_name: KvtierCPUOffloadingSpec
    spec_module_path: kvtier.probes.vllm.spec
    cpu_bytes_to_use: 1073741824
    eviction_policy: lru
    kvtier_collector: in-process
    kvtier_instance: node-7
kv-events-config: '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:7001", "replay_endpoint": "tcp://*:7002"}'
"""


def test_vllm_boots_what_push_writes_over_kvtiers_connector_and_after_a_rollback_to_zero(tmp_path):
    """Pushed over a config that loads kvtier's connector and spec, then rolled back to no
    CPU tier, then given a cold tier: vLLM's parser, config classes, connector factory and
    offloading spec factory take each file, with kvtier's classes and keys still there."""
    vllm = writer("vllm")
    cold = tmp_path / "cold"
    cold.mkdir()
    steps = [EngineSettings(cpu_tier_bytes=2 * GiB, eviction_policy="arc", kv_events=True),
             EngineSettings(cpu_tier_bytes=0),
             EngineSettings(cpu_tier_bytes=GiB, cold_tier_path=str(cold), cold_tier_bytes=GiB)]
    text, paths = KVTIER_SERVE, []
    for i, settings in enumerate(steps):
        text = vllm.render(settings, text, ".yaml").text
        paths.append(tmp_path / f"step{i}.yaml")
        paths[-1].write_text(text)
    broken = tmp_path / "broken.yaml"  # the connector name kvtier's module does not have
    broken.write_text(KVTIER_SERVE.replace("kv_connector: KvtierOffloadingConnector",
                                           "kv_connector: OffloadingConnector"))
    results = side_check([{"kind": "yaml", "path": str(p)} for p in (*paths, broken)])
    assert [r["ok"] for r in results] == [True, True, True, False], results
    assert "not found in kvtier.probes.vllm.connector" in results[3]["error"]
    for result in results[:3]:
        assert result["connector"] == ["KvtierOffloadingConnector", "kvtier.probes.vllm.connector"]
        assert result["extra"]["spec_module_path"] == "kvtier.probes.vllm.spec"
        assert (result["extra"]["kvtier_collector"], result["extra"]["kvtier_instance"]) == (
            "in-process", "node-7")
        assert (result["events"]["endpoint"], result["events"]["replay_endpoint"]) == (
            "tcp://*:7001", "tcp://*:7002")
    sizes = [r["extra"]["cpu_bytes_to_use"] for r in results[:3]]
    specs = [r["extra"]["spec_name"] for r in results[:3]]
    assert sizes == [2 * GiB, 1, GiB]
    assert specs == ["KvtierCPUOffloadingSpec", "KvtierCPUOffloadingSpec", "KvtierTieringOffloadingSpec"]


def test_where_vllm_is_importable_the_shape_check_also_asks_vllms_config_classes():
    """Run in vLLM's environment, the product's check refuses what only vLLM's pydantic
    classes know is wrong (a misspelt KV-events key, a load-failure policy it lacks)."""
    code = """
import json
from kvtier.policy.writers.vllm_shape import ShapeError, check
good = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1}}
out = []
for transfer, events in ((good, {"enable_kv_cache_events": True}),
                         (good, {"enable_kv_cache_events": True, "endpoitn": "tcp://*:1"}),
                         (dict(good, kv_load_failure_policy="maybe"), None)):
    try:
        check(transfer, events)
        out.append("ok")
    except ShapeError as error:
        out.append(str(error))
print("RESULTS " + json.dumps(out))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_TARGET_DEVICE="cpu")
    done = subprocess.run([SIDE_PYTHON, "-c", code], text=True, capture_output=True, timeout=170,
                          env=env)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULTS ")), None)
    assert line, done.stderr[-2000:]
    ok, misspelt, policy = json.loads(line[len("RESULTS "):])
    assert ok == "ok"
    assert misspelt.startswith("vLLM's KVEventsConfig refuses it") and "endpoitn" in misspelt
    assert policy.startswith("vLLM's KVTransferConfig refuses it") and "kv_load_failure_policy" in policy


GUIDE_SERVE = """\
# the guide's first step
model: kvtier/check
kv-offloading-size: 16   # GiB over the ranks
kv-offloading-backend: native
block-size: 16
"""


def test_a_serve_yaml_with_vllms_offloading_size_ends_on_kvtiers_connector_and_the_recommended_size(tmp_path):
    """The guide's kv-offloading-size and kv-offloading-backend make vLLM override the
    kv-transfer-config's connector and size. Pushed where vLLM is importable, the file ends
    with neither; vLLM's parser and config classes then run kvtier's connector with the
    recommended bytes, whatever VLLM_USE_SIMPLE_KV_OFFLOAD says, and the push's own note,
    worked out by vLLM's classes, says so."""
    config = tmp_path / "serve.yaml"
    config.write_text(GUIDE_SERVE)
    reco = tmp_path / "recommendation.json"
    reco.write_text(json.dumps({"kind": KIND, "version": VERSION,
                                "settings": {"cpu_tier_bytes": 8896512, "eviction_policy": "lru"}}))
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_TARGET_DEVICE="cpu")
    done = subprocess.run([SIDE_PYTHON, "-m", "kvtier", "push", "--recommendation", str(reco),
                           "--engine", "vllm", "--config", str(config),
                           "--host-headroom-bytes", str(1 << 40)],
                          capture_output=True, text=True, timeout=170, env=env)
    assert done.returncode == 0, done.stderr
    runs = {"connector": "KvtierOffloadingConnector", "module_path": "kvtier.probes.vllm.connector",
            "cpu_bytes_to_use": 8896512}
    (note,) = [l for l in done.stdout.splitlines() if l.startswith("note: vLLM will run")]
    assert ("KvtierOffloadingConnector from kvtier.probes.vllm.connector with "
            "cpu_bytes_to_use=8896512") in note and "per vLLM 0.33.0's own config classes" in note
    assert any("kv-offloading-size: 16 and kv-offloading-backend: native removed" in l
               and "it ran OffloadingConnector with cpu_bytes_to_use=17179869184" in l
               for l in done.stdout.splitlines()), done.stdout
    for switch in ("0", "1"):
        (result,) = side_check([{"kind": "yaml", "path": str(config)}],
                               VLLM_USE_SIMPLE_KV_OFFLOAD=switch)
        assert result["ok"] and result["runs"] == runs, result
    assert "# the guide's first step" in config.read_text() and "block-size: 16" in config.read_text()


def test_kvtiers_reading_of_the_offloading_shorthand_agrees_with_vllms_own():
    """Where vLLM is not importable push reads the shorthand as vLLM 0.33's
    VllmConfig._post_init_kv_transfer_config does: the same connector, module path and size
    for every backend, switch and transfer config."""
    from kvtier.policy.writers.vllm_shape import Shorthand, resolve_as_kvtier_reads_vllm

    transfers = [None, {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": 5, "eviction_policy": "arc"}},
                 {"kv_connector": "KvtierOffloadingConnector", "kv_role": "kv_producer",
                  "kv_connector_module_path": "kvtier.probes.vllm.connector",
                  "kv_connector_extra_config": {"cpu_bytes_to_use": 7}},
                 {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}]
    cases = [(t, size, backend, simple) for t in transfers for size in (None, 16, 0.5)
             for backend in ("native", "lmcache") for simple in (False, True)]
    results = side_check([{"kind": "post_init", "transfer": t, "size_gib": size, "backend": backend,
                           "simple": simple} for t, size, backend, simple in cases])
    for (transfer, size, backend, simple), result in zip(cases, results):
        ours = resolve_as_kvtier_reads_vllm(transfer, Shorthand(size, backend, simple))
        theirs = result["runs"] or {"connector": None, "module_path": None, "cpu_bytes_to_use": None}
        assert result["ok"] and (ours.connector, ours.module_path, ours.cpu_bytes) == (
            theirs["connector"], theirs["module_path"], theirs["cpu_bytes_to_use"]), (transfer, size, backend, simple)
