"""The sighting filter (admit a block to the CPU tier on the N-th request that references it):
narrated, held equal to the pure-Python oracle in every flow, and, as one cache in front of
LRU at N=2, equal to libCacheSim's LRU behind its Bloom-filter admissioner."""

import random

import pytest

from kvtier.policy.readers import MooncakeReader
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.policies import LRU, Admitted, SightingAdmitter, make_policy
from kvtier.policy.sim.simulator import Simulator
from tests.policy.sim.oracle import SightingAdmitter as OracleSightings
from tests.policy.sim.oracle.simulator import Simulator as OracleSimulator
from tests.policy.sim.simtools import random_prefix_trace, request


def served(sim, *blocks):
    """The tier letters of a one-request prompt: g GPU hit, c CPU promotion, - recomputed."""
    outcome = sim.serve(request(blocks, rid=str(blocks)))
    return "".join({0: "g", 1: "c", 3: "-"}[o.value if o.value < 2 else 3]
                   for o in outcome.outcomes)


def test_the_gpu_tier_keeps_a_fresh_block_only_from_its_second_sighting():
    sim = Simulator(SimConfig(gpu_blocks=2, cpu_blocks=0, gpu_sightings=2))
    assert served(sim, 1, 2) == "--"
    assert 1 not in sim.flow.gpu and 2 not in sim.flow.gpu  # computed once: not cached
    assert served(sim, 1, 2) == "--"    # recomputed: the second sighting keeps them
    assert served(sim, 1, 2) == "gg"
    # a fresh request still takes GPU slots while it runs: what it evicted stays evicted,
    # and the slots it leaves are empty
    assert served(sim, 3, 4) == "--"
    assert len(sim.flow.gpu) == 0
    assert served(sim, 1, 2) == "--"
    plain = Simulator(SimConfig(gpu_blocks=2, cpu_blocks=0))
    assert [served(plain, 1, 2) for _ in range(2)] == ["--", "gg"]


@pytest.mark.parametrize("bad", [dict(gpu_sightings=1), dict(gpu_sightings=-1),
                                 dict(gpu_sightings=2, semantics="trtllm")])
def test_gpu_sightings_is_checked(bad):
    with pytest.raises(ValueError, match="gpu_sightings"):
        SimConfig(gpu_blocks=2, cpu_blocks=2, **bad)


def test_a_block_seen_once_is_dropped_and_one_seen_twice_is_kept():
    sim = Simulator(SimConfig(gpu_blocks=1, cpu_blocks=2),
                    cpu_admitter=SightingAdmitter(2))
    assert served(sim, 1) == "-"        # 1 seen once, on the GPU
    assert served(sim, 2) == "-"        # 1 leaves the GPU with one sighting: dropped
    assert 1 not in sim.flow.cpu
    assert served(sim, 1) == "-"        # recomputed: its second sighting; 2 dropped
    assert served(sim, 3) == "-"        # 1 leaves the GPU with two sightings: kept
    assert 1 in sim.flow.cpu and 2 not in sim.flow.cpu
    assert served(sim, 1) == "c"
    plain = Simulator(SimConfig(gpu_blocks=1, cpu_blocks=2))
    for blocks in ((1,), (2,)):
        served(plain, *blocks)
    assert 1 in plain.flow.cpu          # without the filter every victim is kept


def test_a_gpu_hit_counts_as_a_sighting():
    sim = Simulator(SimConfig(gpu_blocks=2, cpu_blocks=2), cpu_admitter=SightingAdmitter(2))
    assert served(sim, 1) == "-"
    assert served(sim, 1) == "g"        # hit on the GPU: its second sighting
    served(sim, 2), served(sim, 3)      # 1 leaves the GPU: admitted
    assert 1 in sim.flow.cpu


def test_the_tracker_forgets_the_least_recently_seen_block():
    sim = Simulator(SimConfig(gpu_blocks=1, cpu_blocks=4),
                    cpu_admitter=SightingAdmitter(2, max_tracked=2))
    for blocks in ((1,), (2,), (3,), (1,), (4,)):  # 1's first sighting is forgotten by then
        served(sim, *blocks)
    assert 1 not in sim.flow.cpu
    wide = Simulator(SimConfig(gpu_blocks=1, cpu_blocks=4),
                     cpu_admitter=SightingAdmitter(2, max_tracked=3))
    for blocks in ((1,), (2,), (3,), (1,), (4,)):
        served(wide, *blocks)
    assert 1 in wide.flow.cpu


def test_it_composes_with_any_eviction_order():
    records = random_prefix_trace(5, n_requests=300)
    for policy in ("lru", "arc", "s3fifo"):
        config = SimConfig(gpu_blocks=5, cpu_blocks=20, policy=policy)
        inside = Simulator(config, cpu_tier=Admitted(make_policy(policy, 20),
                                                     SightingAdmitter(2))).replay(records)
        beside = Simulator(config, cpu_admitter=SightingAdmitter(2)).replay(records)
        plain = Simulator(config).replay(records)
        assert inside == beside
        assert inside.cpu_stores_total < plain.cpu_stores_total


def random_case(rng):
    semantics = rng.choice(("exclusive", "exclusive", "trtllm", "vllm"))
    cpu = rng.choice((2, 5, 13, 40, None))
    config = SimConfig(gpu_blocks=rng.choice((1, 3, 8, 20)), cpu_blocks=cpu,
                       cold_blocks=0 if semantics != "exclusive" else rng.choice((0, 10)),
                       semantics=semantics, offload_min_priority=0)
    return config, rng.choice((0, 1, 2, 3, 4)), rng.choice((3, 10, 64000))


@pytest.mark.parametrize("seed", range(1, 13))
def test_the_core_equals_the_oracle_request_by_request(seed):
    rng = random.Random(seed)
    records = random_prefix_trace(seed, n_requests=200, max_blocks=rng.choice((6, 14)))
    for _ in range(4):
        config, n, tracked = random_case(rng)
        ours_events, theirs_events = [], []
        ours = Simulator(config, events=ours_events.append,
                         cpu_admitter=SightingAdmitter(n, tracked))
        theirs = OracleSimulator(config, events=theirs_events.append,
                                 cpu_admitter=OracleSightings(n, tracked))
        for record in records:
            assert ours.serve(record).outcomes == theirs.serve(record).outcomes, (config, n)
        assert ours.result == theirs.result
        assert ours_events == theirs_events


class CountingInPython:
    """The same filter written as a plain Python admitter (the core runs it through its
    Python adapter, which tells it each request's blocks)."""

    name, reads_info = "python-sightings", False

    def __init__(self, n):
        self.n, self.seen = n, {}

    def sight(self, keys):
        for key in keys:
            self.seen[key] = self.seen.get(key, 0) + 1

    def admit(self, key, info):
        return self.seen.get(key, 0) >= self.n


def test_a_python_admitter_that_counts_requests_is_told_each_request():
    records = random_prefix_trace(8, n_requests=300)
    config = SimConfig(gpu_blocks=4, cpu_blocks=15)
    compiled = Simulator(config, cpu_admitter=SightingAdmitter(3, 10**6)).replay(records)
    python = Simulator(config, cpu_admitter=CountingInPython(3)).replay(records)
    assert python == compiled
    assert compiled != Simulator(config).replay(records)


lcs = pytest.importorskip("libcachesim")


def one_cache_prefix_hits(records, capacity_blocks, admitted: bool) -> tuple[int, int]:
    """(kvtier, libCacheSim) prefix hits of one LRU cache fed every block reference in order:
    kvtier's LRU behind the sighting filter at N=2 (each request sighted first), libCacheSim's
    LRU behind its BloomFilterAdmissioner (admits an object it has seen before)."""
    cache = Admitted(LRU(capacity_blocks), SightingAdmitter(2, 10**9)) if admitted else \
        LRU(capacity_blocks)
    theirs = lcs.LRU(cache_size=capacity_blocks,
                     **({"admissioner": lcs.BloomFilterAdmissioner()} if admitted else {}))
    req = lcs.Request()
    req.obj_size = 1
    ours_hits = their_hits = 0
    for record in records:
        if admitted:
            cache.sight(record.block_hashes)
        ours_open = their_open = True
        for h in record.block_hashes:
            hit = h in cache
            cache.touch(h) if hit else cache.insert(h)
            ours_open = ours_open and hit
            ours_hits += ours_open
            req.obj_id = h
            their_hit = theirs.get(req)  # every reference reaches the cache
            their_open = their_open and their_hit
            their_hits += their_open
    return ours_hits, their_hits


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("capacity", [10, 40, 150])
def test_at_n2_one_cache_equals_libcachesims_lru_behind_its_bloom_filter(seed, capacity):
    records = random_prefix_trace(seed)
    ours, theirs = one_cache_prefix_hits(records, capacity, admitted=True)
    assert ours == theirs
    assert ours != one_cache_prefix_hits(records, capacity, admitted=False)[0]


def test_at_n2_one_cache_equals_libcachesim_on_the_mooncake_trace(mooncake_path):
    records = list(MooncakeReader(mooncake_path).requests())
    for capacity in (2000, 20000):
        ours, theirs = one_cache_prefix_hits(records, capacity, admitted=True)
        assert ours == theirs
