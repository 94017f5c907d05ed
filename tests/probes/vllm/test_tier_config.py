"""The tier configuration kvtier's vLLM connector stamps on request records, from
``kv_connector_extra_config`` (no vLLM needed: the connector reads it through HookSettings)."""

from __future__ import annotations

import pytest

from kvtier.probes.vllm.hook_settings import HookSettings, offload_tier_config

IN_PROCESS = {"kvtier_collector": "in-process"}


def test_the_default_names_the_offload_tiers_in_the_rollout_s_form():
    assert offload_tier_config({"cpu_bytes_to_use": 10 * (1 << 30)}) == "gpu+cpu:10737418240"
    tiering = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1 << 30,
               "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv"}]}
    assert offload_tier_config(tiering) == "gpu+cpu+file:1073741824"
    assert offload_tier_config({}) is None


def test_a_named_configuration_wins_and_a_client_s_tag_overrides_it():
    settings = HookSettings.from_extra_config(
        {**IN_PROCESS, "cpu_bytes_to_use": 1 << 30, "kvtier_tier_config": "canary"})
    assert settings.tags({}) == {"tier_config_id": "canary"}
    assert settings.tags({"tier_config_id": "gpu-only", "turn": 2}) == {
        "tier_config_id": "gpu-only", "turn": 2}
    derived = HookSettings.from_extra_config({**IN_PROCESS, "cpu_bytes_to_use": 2.0 * (1 << 30)})
    assert derived.tags({}) == {"tier_config_id": "gpu+cpu:2147483648"}
    assert HookSettings.from_extra_config(IN_PROCESS).tags({"turn": 1}) == {"turn": 1}


def test_a_bad_tier_configuration_is_refused_by_name():
    with pytest.raises(ValueError, match="kvtier_tier_config must be a non-empty string"):
        HookSettings.from_extra_config({**IN_PROCESS, "kvtier_tier_config": 7})
