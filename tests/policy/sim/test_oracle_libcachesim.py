"""Cross-check against libCacheSim (PyPI ``libcachesim``): single-tier LRU, ARC and S3-FIFO
prefix hits equal on the same block streams. Skipped when libcachesim is not installed."""

import pytest
from tests.policy.sim.simtools import random_prefix_trace

from kvtier.policy.readers import MooncakeReader
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.simulator import simulate

lcs = pytest.importorskip("libcachesim")

ORACLES = {"lru": "LRU", "arc": "ARC", "s3fifo": "S3FIFO"}


def libcachesim_prefix_hits(policy: str, records, capacity_blocks: int) -> int:
    """Feed every block reference to libCacheSim (unit-size objects) in replay order and
    count, per request, the leading references it reports as hits."""
    cache = getattr(lcs, ORACLES[policy])(cache_size=capacity_blocks)
    req = lcs.Request()
    req.obj_size = 1
    hits = 0
    for record in records:
        prefix_open = True
        for h in record.block_hashes:
            req.obj_id = h
            hit = cache.get(req)
            prefix_open = prefix_open and hit
            hits += prefix_open
    return hits


@pytest.mark.parametrize("policy", list(ORACLES))
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("capacity", [20, 60, 150])  # S3-FIFO in libCacheSim needs >= 20
def test_equal_to_libcachesim_on_random_prefix_traces(policy, seed, capacity):
    records = random_prefix_trace(seed)
    ours = simulate(records, SimConfig(gpu_blocks=capacity, policy=policy)).gpu_hit_blocks
    assert ours == libcachesim_prefix_hits(policy, records, capacity)


@pytest.mark.parametrize("policy", list(ORACLES))
def test_equal_to_libcachesim_on_the_mooncake_trace(policy, mooncake_path):
    records = list(MooncakeReader(mooncake_path).requests())
    for capacity in (2000, 20000):
        ours = simulate(records, SimConfig(gpu_blocks=capacity, policy=policy)).gpu_hit_blocks
        assert ours == libcachesim_prefix_hits(policy, records, capacity)
