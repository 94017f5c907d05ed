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
