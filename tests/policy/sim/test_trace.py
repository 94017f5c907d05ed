"""A trace as arrays: built from records, stripped from them, sliced, replayed."""

import numpy as np
import pytest

from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.simulator import Simulator, simulate
from kvtier.policy.sim.trace import BlockTrace, strip_blocks
from tests.policy.sim.simtools import random_prefix_trace, request


def test_arrays_hold_every_request_in_order():
    records = [request([1, 2, 3], prompt_tokens=10), request([], prompt_tokens=3),
               request([7], block_tokens=8, t=2.5)]
    trace = BlockTrace.from_records(records)
    assert trace.hashes.tolist() == [1, 2, 3, 7] and trace.offsets.tolist() == [0, 3, 3, 4]
    assert trace.prompt_tokens.tolist() == [10, 3, 8] and trace.block_tokens.tolist() == [4, 4, 8]
    assert trace.blocks(2).tolist() == [7] and len(trace) == 3 and trace.block_refs == 4
    later = trace.requests(1)
    assert later.offsets.tolist() == [0, 0, 1] and later.arrival_s.tolist() == [0.0, 2.5]


def test_stripped_records_keep_everything_but_their_blocks():
    records = random_prefix_trace(3, n_requests=50)
    light, trace = strip_blocks(iter(records))
    assert all(r.block_hashes == () for r in light)
    assert [r.prompt_tokens for r in light] == [r.prompt_tokens for r in records]
    assert np.array_equal(trace.hashes, BlockTrace.from_records(records).hashes)
    assert np.array_equal(trace.offsets, BlockTrace.from_records(records).offsets)


@pytest.mark.parametrize("semantics", ["exclusive", "vllm"])
def test_a_trace_replays_like_its_records_and_counts_a_window(semantics):
    records = random_prefix_trace(5, n_requests=200)
    config = SimConfig(gpu_blocks=10, cpu_blocks=30, semantics=semantics)
    trace = BlockTrace.from_records(records)
    whole = Simulator(config).replay_trace(trace, outcomes=True)
    assert whole.result == simulate(records, config)
    window = Simulator(config).replay_trace(trace, count_from=120, outcomes=True)
    assert np.array_equal(window.outcomes, whole.outcomes[120:])
    assert window.result.requests == 80
    assert window.result.recompute_tokens == int(whole.outcomes[120:, 3].sum())


def test_inconsistent_arrays_are_refused():
    trace = BlockTrace.from_records([request([1, 2])])
    with pytest.raises(ValueError, match="offsets must have one entry per request"):
        BlockTrace(trace.hashes, trace.offsets[:1], trace.prompt_tokens, trace.block_tokens,
                   trace.arrival_s, trace.turns, trace.subagent, trace.sessions,
                   trace.finish_classes, trace.finish_s)
    with pytest.raises(ValueError, match="count_from <= count_to"):
        Simulator(SimConfig(gpu_blocks=1)).replay_trace(trace, count_from=2)
