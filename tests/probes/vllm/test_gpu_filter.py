"""kvtier's GPU prefix-cache sighting filter for vLLM, without vLLM: its setting, and its
tracker held equal to the simulator's (vLLM's ``store_threshold`` counting). That the filter,
installed in vLLM's own block pool, serves what the simulator serves is checked against vLLM's
``KVCacheManager`` (``tests/policy/sim/test_oracle_vllm_gpu.py``) and on a serving engine
(``test_gpu_filter_engine.py``)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from kvtier.policy.sim.compiled import core
from kvtier.probes.vllm import gpu_filter
from kvtier.probes.vllm.gpu_filter import Sightings
from kvtier.probes.vllm.hook_settings import HookSettings

IN_PROCESS = {"kvtier_collector": "in-process"}


def test_the_setting_is_read_and_checked_by_name():
    assert HookSettings.from_extra_config(IN_PROCESS).gpu_sightings == 0
    settings = HookSettings.from_extra_config({**IN_PROCESS, "kvtier_gpu_sightings": 3})
    assert settings.gpu_sightings == 3
    for bad in (1, -2, "2", True, 2.0):
        with pytest.raises(ValueError, match="kvtier_gpu_sightings"):
            HookSettings.from_extra_config({**IN_PROCESS, "kvtier_gpu_sightings": bad})


@pytest.mark.parametrize("seed", range(5))
def test_the_tracker_counts_as_the_simulators_does(seed):
    """Random requests over a small id space and a tracker that must forget: after every
    request each id passes here exactly when it passes the simulator's tracker."""
    rng = random.Random(seed)
    threshold, max_tracked = rng.choice((2, 3)), rng.choice((5, 12, 40))
    ours, theirs = Sightings(threshold, max_tracked), core().StoreThreshold(threshold, max_tracked)
    for _ in range(300):
        request = rng.sample(range(60), rng.randint(1, 8))
        ours.count(request)
        theirs.py_count(request)
        assert [ours.passes(k) for k in range(60)] == [theirs.py_passes(k) for k in range(60)]
    assert len(ours.counts) <= max_tracked


def test_a_request_counts_once_however_often_the_scheduler_asks(monkeypatch):
    sightings = Sightings(2)
    monkeypatch.setattr(gpu_filter, "_installed", sightings)
    request = SimpleNamespace(block_hashes=[b"a", b"b"])
    gpu_filter.sight(request)
    gpu_filter.sight(request)  # asked again while waiting, or rescheduled after preemption
    assert not sightings.passes(b"a")
    gpu_filter.sight(SimpleNamespace(block_hashes=[b"a"]))
    assert sightings.passes(b"a") and not sightings.passes(b"b")


def test_nothing_is_counted_without_the_filter(monkeypatch):
    monkeypatch.setattr(gpu_filter, "_installed", None)
    request = SimpleNamespace(block_hashes=[b"a"])
    gpu_filter.sight(request)
    assert not hasattr(request, "_kvtier_sighted")


def test_a_bad_threshold_is_refused():
    with pytest.raises(ValueError, match="kvtier_gpu_sightings"):
        Sightings(1)


def test_a_failing_count_turns_the_filter_off_and_never_reaches_the_engine(monkeypatch, caplog):
    sightings = Sightings(2)
    monkeypatch.setattr(gpu_filter, "_installed", sightings)
    gpu_filter.sight(SimpleNamespace())  # no block_hashes: what a changed vLLM might hand over
    assert sightings.working is False
    assert "caches every block from now on" in caplog.text
    request = SimpleNamespace(block_hashes=[b"a"])
    gpu_filter.sight(request)  # off: nothing counted
    assert not sightings.counts


class RecordingPool:
    """What the wrapper needs of vLLM's ``BlockPool``: the call it wraps, recorded."""

    hash_block_size = 16

    def __init__(self):
        self.masks = []

    def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks, block_size,
                          kv_cache_group_id, block_mask=None):
        self.masks.append(block_mask)


@pytest.fixture
def fake_vllm(monkeypatch):
    """``vllm.v1.core.block_pool`` holding :class:`RecordingPool` (the main environment has no
    vLLM; the wrapper in vLLM's own pool is checked against vLLM's ``KVCacheManager`` in
    ``tests/policy/sim/test_oracle_vllm_gpu.py``), and no filter installed yet."""
    import sys
    import types

    module = types.ModuleType("vllm.v1.core.block_pool")
    pool_class = type("BlockPool", (RecordingPool,), {})
    module.BlockPool = pool_class
    for name in ("vllm", "vllm.v1", "vllm.v1.core"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.core.block_pool", module)
    monkeypatch.setattr(gpu_filter, "_installed", None)
    return pool_class


def test_the_wrapped_pool_gets_the_mask_and_keeps_its_own(fake_vllm):
    sightings = gpu_filter.install(2)
    assert gpu_filter.install(2) is sightings  # the same rule again: nothing more
    with pytest.raises(ValueError, match="cannot install 3"):
        gpu_filter.install(3)
    pool = fake_vllm()
    seen = SimpleNamespace(block_hashes=[b"a", b"b", b"c"])
    gpu_filter.sight(seen)
    gpu_filter.sight(SimpleNamespace(block_hashes=[b"a", b"b"]))
    pool.cache_full_blocks(seen, [], 0, 3, 16, 0)
    pool.cache_full_blocks(seen, [], 1, 3, 16, 0, block_mask=[False, True])
    assert pool.masks == [[True, True, False], [False, False]]
    pool.cache_full_blocks(seen, [], 0, 3, 32, 0, block_mask=[True])  # hashed at another size
    assert pool.masks[-1] == [True]


def test_a_failing_mask_lets_the_engine_cache_every_block(fake_vllm, caplog):
    sightings = gpu_filter.install(2)
    pool = fake_vllm()
    pool.cache_full_blocks(SimpleNamespace(), [], 0, 2, 16, 0)  # a request without hashes
    assert pool.masks == [None] and sightings.working is False
    assert "caches every block from now on" in caplog.text
    pool.cache_full_blocks(SimpleNamespace(block_hashes=[b"a", b"b"]), [], 0, 2, 16, 0)
    assert pool.masks[-1] is None
