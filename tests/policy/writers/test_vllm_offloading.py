"""vLLM's offloading shorthand in a serve YAML (``kv-offloading-size``, GiB over the ranks, and
``kv-offloading-backend``): a push removes it, since vLLM would override the written
kv-transfer-config with it, and says what vLLM ran before. Run without vLLM: what vLLM
runs is worked out by kvtier's reading of its config code (test_vllm_configs_real.py checks
that reading, and the pushed files, against vLLM's own classes)."""

from __future__ import annotations

import json

import pytest

from kvtier.policy.writers import writer
from kvtier.policy.writers.settings import EngineSettings
from kvtier.policy.writers.vllm_shape import Shorthand, resolve_as_kvtier_reads_vllm
from kvtier.policy.writers.yamledit import ConfigFileError, YamlDoc, yaml_get

vllm = writer("vllm")
SETTINGS = EngineSettings(cpu_tier_bytes=8896512, eviction_policy="lru")
GUIDE = """\
# the guide's first step
model: m   # the model
kv-offloading-size: 16   # GiB over the ranks

# how it offloads
kv-offloading-backend: native
port: 8000
"""


def runs(text: str):
    """What vLLM runs with this serve YAML, read as vLLM 0.33 reads it."""
    doc = YamlDoc(text, spellings=True)
    transfer = doc.get(("kv-transfer-config",))
    size, backend = doc.get(("kv-offloading-size",)), doc.get(("kv-offloading-backend",))
    return resolve_as_kvtier_reads_vllm(
        json.loads(transfer) if isinstance(transfer, str) else transfer,
        Shorthand(None if size is None else float(size), backend or "native"))


def test_the_guides_shorthand_is_replaced_by_kvtiers_connector_with_the_recommended_size():
    assert (runs(GUIDE).connector, runs(GUIDE).cpu_bytes) == ("OffloadingConnector", 16 * 2**30)
    out = vllm.render(SETTINGS, GUIDE, ".yaml")
    after = runs(out.text)
    assert (after.connector, after.module_path, after.cpu_bytes) == (
        "KvtierOffloadingConnector", "kvtier.probes.vllm.connector", 8896512)
    assert out.text.startswith("# the guide's first step\nmodel: m   # the model\n\n"
                               "# how it offloads\nport: 8000\nkv-transfer-config: ")
    (moved,) = [n for n in out.notes if "removed" in n]
    assert moved.startswith("kv-offloading-size: 16 and kv-offloading-backend: native removed")
    assert "it ran OffloadingConnector with cpu_bytes_to_use=17179869184 (16.00 GiB" in moved
    assert "kvtier's recording KvtierOffloadingConnector" in moved
    assert any(n.startswith("vLLM will run KvtierOffloadingConnector from kvtier.probes.vllm.connector "
                            "with cpu_bytes_to_use=8896512") for n in out.notes)


def test_the_simple_offload_switch_is_named_in_what_vllm_ran(monkeypatch):
    monkeypatch.setenv("VLLM_USE_SIMPLE_KV_OFFLOAD", "1")
    (moved,) = [n for n in vllm.render(SETTINGS, GUIDE, ".yaml").notes if "removed" in n]
    assert "it ran SimpleCPUOffloadConnector" in moved and "VLLM_USE_SIMPLE_KV_OFFLOAD=1 as here" in moved


def test_a_transfer_config_beside_the_shorthand_keeps_its_connector_and_the_files_spelling():
    text = ("model: m\nkv_offloading_size: 2.5\nkv-transfer-config:\n"
            "  kv_connector: KvtierOffloadingConnector  # ours\n"
            "  kv_connector_module_path: kvtier.probes.vllm.connector\n  kv_role: kv_both\n"
            "  kv_connector_extra_config:\n    spec_name: KvtierCPUOffloadingSpec\n"
            "    spec_module_path: kvtier.probes.vllm.spec\n    cpu_bytes_to_use: 1\n")
    # before: vLLM names its own connector from kvtier's module path, which has none
    assert (runs(text).connector, runs(text).module_path) == ("OffloadingConnector",
                                                              "kvtier.probes.vllm.connector")
    out = vllm.render(SETTINGS, text, ".yaml")
    assert "kv_offloading_size" not in out.text and "KvtierOffloadingConnector  # ours" in out.text
    assert (runs(out.text).connector, runs(out.text).cpu_bytes) == ("KvtierOffloadingConnector", 8896512)
    (moved,) = [n for n in out.notes if "removed" in n]
    assert moved.startswith("kv_offloading_size: 2.5 removed") and "the connector kv-transfer-config names" in moved


def test_the_lmcache_backend_is_taken_over_only_with_force():
    text = "model: m\nkv-offloading-size: 16\nkv-offloading-backend: lmcache\n"
    with pytest.raises(ConfigFileError, match="lmcache makes vLLM load LMCache's LMCacheMPConnector.*--force"):
        vllm.render(SETTINGS, text, ".yaml")
    out = vllm.render(SETTINGS, text, ".yaml", force=True)
    assert (runs(out.text).connector, runs(out.text).cpu_bytes) == ("KvtierOffloadingConnector", 8896512)
    assert yaml_get(out.text, ("kv-offloading-backend",)) is None


@pytest.mark.parametrize("line, says", [
    ("kv-offloading-size: lots", "kv-offloading-size must be a number of GiB >= 0"),
    ("kv-offloading-size: -1", "kv-offloading-size must be a number of GiB >= 0"),
    ("kv-offloading-size: .nan", "kv-offloading-size must be a number of GiB >= 0"),
    ("kv_offloading_size: .inf", "kv_offloading_size must be a number of GiB >= 0"),
    ("kv-offloading-size: 1" + "0" * 400, "kv-offloading-size must be a number of GiB >= 0"),
    ("kv-offloading-size: 4\nkv-offloading-backend: magic", "kv-offloading-backend 'magic' is not one of"),
])
def test_a_shorthand_vllm_would_refuse_is_named(line, says):
    with pytest.raises(ConfigFileError, match=says):
        vllm.render(SETTINGS, f"model: m\n{line}\n", ".yaml")


def test_a_backend_without_a_size_does_nothing_and_stays():
    text = "model: m\nkv-offloading-backend: native\n"
    out = vllm.render(SETTINGS, text, ".yaml")
    assert out.text.startswith(text) and not [n for n in out.notes if "removed" in n]


def test_a_json_transfer_config_says_a_size_flag_would_override_it():
    out = vllm.render(SETTINGS, None, ".json")
    (note,) = [n for n in out.notes if n.startswith("vLLM will run")]
    assert "OffloadingConnector with cpu_bytes_to_use=8896512" in note
    assert "unless vllm serve is also given --kv-offloading-size" in note


def test_a_flow_style_file_loses_the_keys_too():
    out = vllm.render(SETTINGS, "{model: m, kv-offloading-size: 16}\n", ".yaml")
    assert "kv-offloading-size" not in out.text and runs(out.text).cpu_bytes == 8896512
