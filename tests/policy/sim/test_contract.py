"""The contract every cache policy keeps, run against each one (and an admission wrapper)."""

import random

import pytest

from policy.sim.policies import (
    POLICIES,
    Admitted,
    BlockInfo,
    OfferCountAdmitter,
    make_policy,
)


def build(name, capacity):
    if name == "admitted-lru":
        return Admitted(make_policy("lru", capacity), OfferCountAdmitter(min_offers=0))
    return make_policy(name, capacity)


NAMES = [*POLICIES, "admitted-lru"]


def info_for(key, rng):
    return BlockInfo(priority=rng.choice((10, 35, 60)), next_use=rng.randrange(1000), position=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("capacity", [1, 3, 17])
def test_random_operations_match_a_set_model(name, capacity):
    """Residency equals inserted minus victims minus removed, and never exceeds capacity."""
    rng = random.Random(capacity)
    cache, model = build(name, capacity), set()
    for _ in range(3000):
        key = rng.randrange(40)
        op = rng.random()
        if op < 0.15 and model:
            victim = rng.choice(sorted(model))
            cache.remove(victim)
            model.discard(victim)
        elif key in model:
            cache.touch(key, info_for(key, rng))
        else:
            victims = cache.insert(key, info_for(key, rng))
            assert len(victims) == len(set(victims))
            assert set(victims) <= model, "victims must have been resident"
            model -= set(victims)
            model.add(key)
        assert set(cache) == model
        assert len(cache) == len(model) <= capacity


@pytest.mark.parametrize("name", NAMES)
def test_unlimited_capacity_never_evicts(name):
    cache = build(name, None)
    assert all(cache.insert(k) == [] for k in range(500))
    assert len(cache) == 500


@pytest.mark.parametrize("name", NAMES)
def test_zero_capacity_stores_nothing(name):
    cache = build(name, 0)
    assert cache.insert("a") == []
    assert "a" not in cache and len(cache) == 0


@pytest.mark.parametrize("name", NAMES)
def test_inserting_a_resident_key_evicts_nothing(name):
    cache = build(name, 2)
    cache.insert("a"), cache.insert("b")
    assert cache.insert("a") == []
    assert set(cache) == {"a", "b"}


@pytest.mark.parametrize("name", NAMES)
def test_missing_keys_raise_key_error(name):
    cache = build(name, 2)
    with pytest.raises(KeyError):
        cache.touch("nope")
    with pytest.raises(KeyError):
        cache.remove("nope")
    with pytest.raises(KeyError):
        cache.pop_victim()


@pytest.mark.parametrize("name", NAMES)
def test_pop_victim_frees_one_slot(name):
    cache = build(name, 3)
    for key in "abc":
        cache.insert(key)
    victim = cache.pop_victim()
    assert victim in "abc" and victim not in cache and len(cache) == 2


@pytest.mark.parametrize("bad", [-1, 2.5, True, "10"])
def test_bad_capacity_is_rejected_naming_the_value(bad):
    with pytest.raises(ValueError, match="capacity_blocks must be an int >= 0 or None"):
        make_policy("lru", bad)


def test_unknown_policy_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown eviction policy 'fifo'; allowed: lru, arc, s3fifo"):
        make_policy("fifo", 3)
