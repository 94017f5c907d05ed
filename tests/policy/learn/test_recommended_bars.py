"""What ``recommended`` deploys, held to its bars on the traces kvtier ships: trained on the
earlier half (by requests) and counted on the later half, it is never more than half a point
below plain LRU, nor below libCacheSim's LRU behind its Bloom filter (one cache of GPU+CPU
size on the same block stream, a block admitted on its second request: the simple rule a team
could deploy by hand). ``kvtier evaluate --split requests --train-fraction 0.5 --policies
lru,recommended --libcachesim lcs:lru+bloom`` at the same sizes prints the same rows (WEKA:
``--coarsen 32``).

Both bars are measured, not fitted: libCacheSim is an independent simulator, and nothing of
the later half reaches the choice. Where the margin is small (Mooncake at 2,000 GPU blocks,
0.04 to 0.09 points) a change to the simulator or the choice that moves it shows here first."""

from __future__ import annotations

import pytest

from kvtier.policy.learn.baselines.external import external_rows
from kvtier.policy.learn.compare import compare
from kvtier.policy.learn.replay import Tiers
from kvtier.policy.learn.split import Split
from kvtier.policy.learn.subset import limited
from kvtier.policy.readers import open_trace
from kvtier.policy.sim.trace import strip_blocks
from kvtier.traces import bundled_agentic_trace, bundled_trace

BELOW_LRU_POINTS = 0.5
BLOOM = "lcs:lru+bloom"


def _split(path, coarsen: int = 1) -> Split:
    records = list(open_trace(path).requests())
    if coarsen > 1:  # 64-token WEKA blocks merged 32 at a time, as the notes' rows are
        records = list(limited(records, None, coarsen))
    records, trace = strip_blocks(records)
    return Split.by_count(records, 0.5).with_traces(trace)


@pytest.fixture(scope="module")
def mooncake() -> Split:
    return _split(bundled_trace())


@pytest.fixture(scope="module")
def weka_slice() -> Split:
    return _split(bundled_agentic_trace(), coarsen=32)


def _bars(split: Split, tiers: Tiers) -> tuple[float, float, float, str]:
    out = compare(split, tiers, ["lru", "recommended"])
    rows = {r["policy"]: r["token_hit_ratio"] for r in out["policies"]}
    bloom = external_rows(split.records, split.count_from,
                          tiers.gpu_blocks + tiers.cpu_blocks, [BLOOM],
                          trace=split.trace)[0]["token_hit_ratio"]
    return rows["recommended"], rows["lru"], bloom, out["learned"]["recommended"]["deploys"]


@pytest.mark.parametrize("gpu_blocks, cpu_blocks", [
    (2000, 2000), (2000, 5000), (2000, 10000), (1000, 2500),
    # the training period's latest slice ranks the learned next-use order first (0.2364
    # against the GPU filter's 0.2309) and later time the other way (0.1980 against 0.2164,
    # libCacheSim's row 0.2145): the margin a learned pair must win by keeps the filter
    (4000, 4000)])
def test_recommended_meets_both_bars_on_mooncake(mooncake, gpu_blocks, cpu_blocks):
    recommended, lru, bloom, deploys = _bars(mooncake, Tiers(gpu_blocks, cpu_blocks))
    assert recommended >= lru - BELOW_LRU_POINTS / 100, deploys
    assert recommended >= bloom, (deploys, recommended, bloom)


@pytest.mark.parametrize("cpu_blocks", [200, 400])
def test_recommended_meets_both_bars_on_the_agentic_sessions(weka_slice, cpu_blocks):
    recommended, lru, bloom, deploys = _bars(weka_slice, Tiers(200, cpu_blocks))
    assert recommended >= lru - BELOW_LRU_POINTS / 100, deploys
    assert recommended >= bloom, (deploys, recommended, bloom)
