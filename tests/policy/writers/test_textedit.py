"""The line editors keep what kvtier does not own and change only what it sets."""

from __future__ import annotations

import pytest

from policy.writers.textedit import (
    args_get, args_set, env_get, env_set, parse_yaml_scalar, yaml_get, yaml_scalar, yaml_set,
)

TRT = """\
# hand-tuned
backend: pytorch   # keep
kv_cache_config:
  # GPU share
  free_gpu_memory_fraction: 0.85
  host_cache_size: 1000  # bytes

max_batch_size: 64
"""


def test_yaml_set_replaces_in_place_appends_missing_and_keeps_comments():
    out = yaml_set(TRT, {("kv_cache_config", "host_cache_size"): 2048,
                         ("kv_cache_config", "tokens_per_block"): 32,
                         ("backend",): "pytorch", ("enable_iter_perf_stats",): True})
    assert out.splitlines() == [
        "# hand-tuned", "backend: pytorch  # keep", "kv_cache_config:", "  # GPU share",
        "  free_gpu_memory_fraction: 0.85", "  host_cache_size: 2048  # bytes",
        "  tokens_per_block: 32", "", "max_batch_size: 64", "enable_iter_perf_stats: true"]
    assert yaml_get(out, ("kv_cache_config", "tokens_per_block")) == 32
    assert yaml_get(out, ("kv_cache_config", "missing")) is None


def test_yaml_set_creates_a_section_and_matches_its_indent():
    assert yaml_set("", {("a", "b"): 1}) == "a:\n  b: 1\n"
    four = "a:\n    x: 1\n"
    assert yaml_set(four, {("a", "y"): "z"}) == "a:\n    x: 1\n    y: z\n"


def test_yaml_set_refuses_what_it_cannot_edit_safely():
    with pytest.raises(ValueError, match="flow style"):
        yaml_set("kv_cache_config: {host_cache_size: 1}\n", {("kv_cache_config", "x"): 1})
    with pytest.raises(ValueError, match="is a mapping"):
        yaml_set("a:\n  b: 1\n", {("a",): 3})


@pytest.mark.parametrize("value", [
    "plain", "file:///mnt/kv/", "true", "yes", "123", "1e3", "", "a: b", "#x", '{"k": 1}',
    "it's", None, True, 7, 2.5])
def test_yaml_scalars_round_trip(value):
    assert parse_yaml_scalar(yaml_scalar(value)) == value


def test_env_and_args_files():
    env = "# kvbm\nexport DYN_KVBM_CPU_CACHE_GB=4\nOTHER=x\n"
    out = env_set(env, {"DYN_KVBM_CPU_CACHE_GB": 16.0, "DYN_KVBM_DISK_CACHE_GB": 100})
    assert out == "# kvbm\nexport DYN_KVBM_CPU_CACHE_GB=16.0\nOTHER=x\nDYN_KVBM_DISK_CACHE_GB=100\n"
    assert env_get(out, "OTHER") == "x"
    with pytest.raises(ValueError, match="quoting"):
        env_set("", {"K": "a b"})
    args = "--model-path M\n--hicache-ratio 2\n--enable-metrics\n"
    out = args_set(args, {"--hicache-ratio": False, "--hicache-size": 8,
                          "--enable-hierarchical-cache": True, "--model-path": "M2"})
    assert out == "--model-path M2\n--enable-metrics\n--hicache-size 8\n--enable-hierarchical-cache\n"
    assert args_get(out, "--hicache-size") == "8" and args_get(out, "--enable-metrics") is True
