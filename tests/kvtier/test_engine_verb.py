"""`kvtier engine` flags -> engine configuration."""

from __future__ import annotations

import argparse

import pytest

from kvtier.errors import KvtierError
from kvtier.verbs import engine as verb


def parse(*argv):
    from kvtier.cli import _flags_of

    parser = argparse.ArgumentParser()
    verb.add_arguments(parser)
    args = parser.parse_args(argv)
    args._flags = _flags_of(parser)  # what the command line attaches: messages name flags
    return args


def test_flags_become_the_tier_configuration(tmp_path):
    config = verb.config_from_args(parse("--gpu-blocks", "32", "--cpu-blocks", "64", "--file-blocks",
                                         "128", "--file-dir", str(tmp_path), "--block-size", "8"))
    assert (config.tiers.gpu_blocks, config.tiers.cpu_blocks, config.tiers.cold_blocks) == (32, 64, 128)
    assert config.block_size_tokens == 8 and config.tiers.config_id == "gpu32-cpu64-file128"


@pytest.mark.parametrize("argv, fragment", [
    (("--eviction-policy", "mru"), "unknown --eviction-policy 'mru'; allowed: lru, fifo"),
    (("--cpu-blocks", "0", "--file-blocks", "4", "--file-dir", "/tmp"), "needs --cpu-blocks >= 1"),
    (("--cpu-blocks", "4", "--file-blocks", "4"), "--cold-blocks 4 needs --file-dir"),
    (("--block-size", "0"), "--block-size must be >= 1"),
])
def test_bad_flags_name_the_value(argv, fragment):
    with pytest.raises(KvtierError, match=fragment):
        verb.config_from_args(parse(*argv))


def test_the_cold_tier_flag_keeps_its_old_spelling(tmp_path):
    new = verb.config_from_args(parse("--cpu-blocks", "8", "--cold-blocks", "16", "--file-dir", str(tmp_path)))
    old = verb.config_from_args(parse("--cpu-blocks", "8", "--file-blocks", "16", "--file-dir", str(tmp_path)))
    assert new == old and new.tiers.cold_blocks == 16
