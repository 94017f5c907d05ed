"""The one-pass LRU curve equals a per-capacity replay of the simulator."""

import numpy as np
import pytest
from tests.policy.sim.simtools import random_prefix_trace

from kvtier.policy.curves import FIRST_USE, lru_curve
from kvtier.policy.runs import RunTrace, find_runs, run_distances
from kvtier.policy.readers import MooncakeReader
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.simulator import simulate


def stack_distances(hashes: np.ndarray) -> np.ndarray:
    """The curve's run-compressed LRU stack distance of every reference of one request (1-based),
    expanded back to references; :data:`FIRST_USE` for first uses."""
    one = np.ones(1, dtype=np.int64)
    trace = RunTrace(np.asarray(hashes, dtype=np.uint64), np.zeros(1, dtype=np.int64), one, one,
                     len(hashes))
    runs = find_runs(trace)
    return np.repeat(run_distances(runs, len(trace.hashes), FIRST_USE), runs.lengths)


def test_stack_distances_by_hand():
    # a b c a b b d a
    hashes = np.array([1, 2, 3, 1, 2, 2, 4, 1], dtype=np.uint64)
    expected = [FIRST_USE, FIRST_USE, FIRST_USE, 3, 3, 1, FIRST_USE, 3]
    assert stack_distances(hashes).tolist() == expected


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_curve_equals_replay_at_every_capacity(seed):
    records = random_prefix_trace(seed, n_requests=200)
    curve = lru_curve(records)
    for capacity in [0, *range(1, 80), None]:
        replay = simulate(records, SimConfig(gpu_blocks=capacity))
        assert curve.token_hit_ratio(capacity) == pytest.approx(replay.token_hit_ratio, abs=1e-12)
        assert curve.block_hit_ratio(capacity) == pytest.approx(replay.block_hit_ratio, abs=1e-12)


def test_curve_is_monotone_and_ends_at_the_unlimited_ratio(mooncake_path):
    records = list(MooncakeReader(mooncake_path).requests())
    curve = lru_curve(records)
    assert np.all(np.diff(curve.hit_tokens) > 0) and np.all(np.diff(curve.capacities_blocks) > 0)
    assert curve.token_hit_ratio(None) == pytest.approx(0.3736, abs=0.001)
    for capacity in (3000, 30000):
        assert curve.token_hit_ratio(capacity) == pytest.approx(
            simulate(records, SimConfig(gpu_blocks=capacity)).token_hit_ratio, abs=1e-12)


def test_empty_trace_gives_an_empty_curve():
    curve = lru_curve([])
    assert curve.token_hit_ratio(10) == 0.0 and curve.token_hit_ratio(None) == 0.0


def naive_stack_distances(keys):
    """Distinct keys since the previous use, counted by brute force."""
    out = []
    for t, key in enumerate(keys):
        previous = max((p for p in range(t) if keys[p] == key), default=None)
        out.append(FIRST_USE if previous is None else 1 + len(set(keys[previous + 1:t])))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_run_compressed_distances_equal_brute_force(seed):
    import random
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 8, 30])
    keys = []
    while len(keys) < 300:  # mix random references with re-sent stretches (runs)
        if keys and rng.random() < 0.3:
            start = rng.randrange(len(keys))
            keys += keys[start:start + rng.randrange(1, 20)]
        else:
            keys.append(rng.randrange(alphabet))
    got = stack_distances(np.array(keys, dtype=np.uint64)).tolist()
    assert got == naive_stack_distances(keys)
