"""`kvtier engine` flags -> engine configuration (the verb module is registered by the lead)."""

from __future__ import annotations

import argparse

import pytest

from kvtier.errors import KvtierError
from kvtier.verbs import engine as verb


def parse(*argv):
    parser = argparse.ArgumentParser()
    verb.add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_become_the_tier_configuration(tmp_path):
    config = verb.config_from_args(parse("--gpu-blocks", "32", "--cpu-blocks", "64", "--file-blocks",
                                         "128", "--file-dir", str(tmp_path), "--block-size", "8"))
    assert (config.tiers.gpu_blocks, config.tiers.cpu_blocks, config.tiers.file_blocks) == (32, 64, 128)
    assert config.block_size_tokens == 8 and config.tiers.config_id == "gpu32-cpu64-file128"


@pytest.mark.parametrize("argv, fragment", [
    (("--eviction-policy", "mru"), "allowed: lru, fifo"),
    (("--cpu-blocks", "0", "--file-blocks", "4"), "needs cpu_blocks"),
    (("--cpu-blocks", "4", "--file-blocks", "4"), "file_dir"),
    (("--block-size", "0"), "block_size_tokens"),
])
def test_bad_flags_name_the_value(argv, fragment):
    with pytest.raises(KvtierError, match=fragment):
        verb.config_from_args(parse(*argv))
