"""The env and argument-file editors keep what kvtier does not own and change only what it sets."""

from __future__ import annotations

import pytest

from kvtier.policy.writers.textedit import args_set, env_get, env_set
from tests.policy.writers.args_file import args_get

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
