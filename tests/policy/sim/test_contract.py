"""The contract every tier keeps (the one tier protocol), run against each policy, an admission
wrapper, learned retention and vLLM's request-scoped CPU cores."""

import random

import pytest

from kvtier.policy.sim.policies import (
    POLICIES,
    Admitted,
    BlockInfo,
    OfferCountAdmitter,
    make_policy,
)


from kvtier.policy.learn.retention import LearnedRetention
from kvtier.policy.sim.policies import VllmARC, VllmLRU

EXTRA = {
    "admitted-lru": lambda c: Admitted(make_policy("lru", c), OfferCountAdmitter(min_offers=0)),
    "learned-retention": lambda c: LearnedRetention(c, {}, tau_s=100.0),
    "vllm-lru": VllmLRU,
    "vllm-arc": VllmARC,
}


def build(name, capacity):
    if name in EXTRA:
        return EXTRA[name](capacity)
    return make_policy(name, capacity)


NAMES = [*POLICIES, *EXTRA]


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


class Refuses:
    """An admitter that says no to every block."""

    name = "refuses"
    reads_info = False

    def admit(self, key, info):
        return False


@pytest.mark.parametrize("capacity", [1, 3, None])
def test_a_refusing_admitter_stores_nothing_and_evicts_nothing(capacity):
    cache = Admitted(make_policy("lru", capacity), Refuses())
    rng = random.Random(7)
    for _ in range(200):
        assert cache.insert(rng.randrange(20), info_for(0, rng)) == []
    assert len(cache) == 0 and set(cache) == set()
    with pytest.raises(KeyError):
        cache.pop_victim()


@pytest.mark.parametrize("core", [VllmLRU, VllmARC])
@pytest.mark.parametrize("capacity", [1, 4, 9])
def test_request_scoped_eviction_is_atomic_and_skips_protected_blocks(core, capacity):
    """``evict(n, protected)`` returns n victims outside ``protected`` that were resident, or
    None and changes nothing; across requests (begin/finish) residency stays a set model."""
    rng = random.Random(capacity)
    cache, model = core(capacity), set()
    for step in range(2000):
        if step % 7 == 0:
            cache.finish()
            cache.begin()
        key, op = rng.randrange(30), rng.random()
        info = BlockInfo(position=rng.randrange(12))
        if op < 0.3:
            n = rng.randrange(1, capacity + 2)
            protected = set(rng.sample(range(30), rng.randrange(6)))
            before = set(cache)
            victims = cache.evict(n, protected)
            if victims is None:
                assert set(cache) == before
                assert len(before - protected) < n
            else:
                assert len(victims) == len(set(victims)) == n
                assert set(victims) <= before - protected
                model -= set(victims)
        elif op < 0.4 and model:
            victim = rng.choice(sorted(model))
            cache.remove(victim)
            model.discard(victim)
        elif key in model:
            cache.touch(key, info)
        else:
            victims = cache.insert(key, info)
            assert set(victims) <= model
            model -= set(victims)
            model.add(key)
        assert set(cache) == model and len(cache) == len(model) <= capacity


@pytest.mark.parametrize("name", [*POLICIES, "admitted-lru"])
def test_per_access_policies_evict_n_in_their_order_or_nothing(name):
    cache = build(name, 5)
    for key in range(5):
        cache.insert(key, BlockInfo(next_use=key))
    assert cache.evict(6) is None and len(cache) == 5
    victims = cache.evict(2)
    assert len(victims) == 2 and not set(victims) & set(cache) and len(cache) == 3
    with pytest.raises(ValueError, match="cannot evict around protected blocks"):
        cache.evict(1, {0})


@pytest.mark.parametrize("name", NAMES)
def test_capabilities_are_declared(name):
    cache = build(name, 3)
    assert isinstance(cache.reads_info, bool) and isinstance(cache.uses_future, bool)
    assert cache.request_scoped == name.startswith("vllm")
