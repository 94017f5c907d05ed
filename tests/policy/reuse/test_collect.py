"""The reuse pass equals a plain per-reference loop (the oracle), field by field."""

import random
from dataclasses import replace

import pytest

from kvtier.policy.readers import MooncakeReader
from kvtier.policy.reuse import collect, report_from_stats
from tests.policy.reuse.reference_collect import reference_collect
from tests.policy.sim.simtools import random_prefix_trace, request


def assert_same(records):
    slow, fast = reference_collect(records), collect(records)
    assert fast.blocks == slow.blocks
    for name in ("requests", "prompt_tokens", "block_refs", "ideal_hit_tokens", "first_s",
                 "last_s", "ideal_hit_tokens_per_request", "has_measured_gpu_hits", "block_tokens"):
        assert getattr(fast, name) == getattr(slow, name), name
    for name in ("since_creation", "since_last_use", "since_last_use_by_turn"):
        got, want = getattr(fast, name), getattr(slow, name)
        assert {k: (h.counts, h.total) for k, h in got.items()} == \
               {k: (h.counts, h.total) for k, h in want.items()}, name
    assert report_from_stats(fast) == report_from_stats(slow)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_equal_on_random_traces_with_types_and_turns(seed):
    rng = random.Random(seed)
    records = [replace(r, arrival_s=r.arrival_s * rng.choice([0.001, 0.7, 13.0]),
                       request_type=rng.choice([None, "text", "api"]),
                       turn=rng.choice([None, 1, 2, 4, 12]))
               for r in random_prefix_trace(seed)]
    records.sort(key=lambda r: r.arrival_s)
    assert_same(records)


def test_equal_with_empty_requests_and_partial_blocks():
    assert_same([request([1, 2], prompt_tokens=5), request([]), request([1, 2, 3], prompt_tokens=9),
                 request([1, 1, 2])])
    assert_same([])


def test_equal_on_the_mooncake_trace(mooncake_path):
    assert_same(list(MooncakeReader(mooncake_path).requests()))
