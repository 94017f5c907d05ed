"""A policy written in Python joins the one registry and runs everywhere a compiled one does:
policy/README.md's CLOCK example, run from the README's own code block, equals libCacheSim's
Clock and a hand scenario; `kvtier simulate` and `kvtier evaluate` name it; a Python LRU in
every tier of the exclusive flow, and a request-scoped one as vLLM's CPU tier, equal the
compiled LRU through the core's Python-tier adapter."""

from __future__ import annotations

import json
import re
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

from kvtier.cli import main
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.policies import (
    POLICIES,
    CachePolicy,
    VllmLRU,
    make_policy,
    policy_names,
    register_policy,
)
from kvtier.policy.sim.simulator import simulate
from tests.policy.learn.synthetic import conversations
from tests.policy.sim.simtools import random_prefix_trace

README = Path(__file__).resolve().parents[3] / "policy" / "README.md"
MODULE = "readme_policies"


@pytest.fixture
def registry():
    """The registry as it was before the test, restored after it (a fresh one per test)."""
    saved = dict(POLICIES)
    yield POLICIES
    POLICIES.clear()
    POLICIES.update(saved)


@pytest.fixture
def readme_module(tmp_path, monkeypatch, registry):
    """policy/README.md's Python block, saved as a module on the path (not yet imported)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (code,) = [b for b in blocks if "register_policy(" in b]
    (tmp_path / f"{MODULE}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield MODULE
    sys.modules.pop(MODULE, None)


@pytest.fixture
def clock(readme_module):
    __import__(readme_module)
    return POLICIES["clock"].cls


def test_the_readme_registers_clock_as_a_python_policy(clock):
    spec = POLICIES["clock"]
    assert not spec.compiled and spec.semantics == ("exclusive",) and spec.evaluate
    assert "clock" in policy_names("exclusive") and "clock" not in policy_names("vllm")


def test_clock_gives_a_referenced_block_a_second_chance(clock):
    cache = make_policy("clock", 3)
    for key in (1, 2, 3):
        cache.insert(key)
    cache.touch(1)
    assert cache.insert(4) == [2]  # 1 was used: it goes round once more, 2 goes
    assert cache.insert(5) == [3]
    assert cache.insert(6) == [1]  # 1's bit was cleared when it passed the hand
    assert set(cache) == {4, 5, 6}


def libcachesim_clock_prefix_hits(records, capacity_blocks: int) -> int:
    """libCacheSim's Clock (one reference bit) fed every block reference in replay order;
    per request, the leading references it reports as hits."""
    lcs = pytest.importorskip("libcachesim")
    cache = lcs.Clock(cache_size=capacity_blocks)
    req = lcs.Request()
    req.obj_size = 1
    hits = 0
    for record in records:
        prefix_open = True
        for h in record.block_hashes:
            req.obj_id = h
            prefix_open = cache.get(req) and prefix_open
            hits += prefix_open
    return hits


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("capacity", [5, 20, 60])
def test_clock_equals_libcachesims_clock(clock, seed, capacity):
    records = random_prefix_trace(seed)
    ours = simulate(records, SimConfig(gpu_blocks=capacity, policy="clock")).gpu_hit_blocks
    assert ours == libcachesim_clock_prefix_hits(records, capacity)


def write_mooncake(path, records):
    lines = [{"timestamp": int(r.arrival_s * 1000), "input_length": r.prompt_tokens,
              "output_length": 8, "hash_ids": list(r.block_hashes)} for r in records]
    path.write_text("".join(json.dumps(o) + "\n" for o in lines))
    return path


def test_simulate_names_a_policy_its_module_registers(readme_module, tmp_path, capsys):
    records = conversations(200, seed=3, block_tokens=512)
    trace = write_mooncake(tmp_path / "t.jsonl", records)
    assert main(["simulate", "--policy-module", readme_module, "--policy", "clock", "--trace",
                 str(trace), "--gpu-tokens", str(20 * 512), "--cpu-tokens", str(60 * 512),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = simulate(records, SimConfig(gpu_blocks=20, cpu_blocks=60, policy="clock",
                                           default_block_tokens=512))
    assert out["policy"] == "clock"
    assert out["token_hit_ratio"] == pytest.approx(expected.token_hit_ratio)


def test_evaluate_compares_a_policy_its_module_registers(readme_module, tmp_path, capsys):
    trace = write_mooncake(tmp_path / "t.jsonl", conversations(400, seed=5, block_tokens=512))
    assert main(["evaluate", "--policy-module", readme_module, "--policies", "lru,clock",
                 "--trace", str(trace), "--gpu-tokens", str(30 * 512), "--cpu-tokens",
                 str(200 * 512), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["policies"]
    assert [r["policy"] for r in rows] == ["lru", "clock"]
    clock = rows[1]
    assert (clock["gpu_hit_tokens"] + clock["cpu_promotion_tokens"]
            + clock["cold_promotion_tokens"] + clock["recompute_tokens"]) == clock["prompt_tokens"]


class PythonLRU(CachePolicy):
    """LRU in plain Python: the compiled LRU's twin, to hold the adapter to it."""

    name = "python-lru"

    def __init__(self, capacity_blocks):
        super().__init__(capacity_blocks)
        self._order = OrderedDict()

    def _store(self, key, info):
        self._order[key] = None

    def _hit(self, key, info):
        self._order.move_to_end(key)

    def _evict(self):
        return self._order.popitem(last=False)[0]

    def _forget(self, key):
        del self._order[key]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_python_lru_in_every_exclusive_tier_equals_the_compiled_lru(registry, seed):
    register_policy(PythonLRU, "LRU in Python")
    records = random_prefix_trace(seed, n_requests=200)
    for gpu, cpu, cold, threshold in ((4, 10, 30, 0), (8, 0, 0, 0), (3, 7, None, 2),
                                      (None, 0, 0, 0)):
        config = dict(gpu_blocks=gpu, cpu_blocks=cpu, cold_blocks=cold,
                      store_threshold=threshold)
        assert (simulate(records, SimConfig(policy="python-lru", **config))
                == simulate(records, SimConfig(policy="lru", **config))), config


class RequestScopedLRU(CachePolicy):
    """A request-scoped policy in Python (here it hands every call to the keyed vLLM LRU)."""

    name = "python-vllm-lru"
    request_scoped = True

    def __init__(self, capacity_blocks):
        super().__init__(capacity_blocks)
        self._inner = VllmLRU(capacity_blocks)

    def __contains__(self, key):
        return key in self._inner

    def __len__(self):
        return len(self._inner)

    def __iter__(self):
        return iter(self._inner)

    def touch(self, key, info=None):
        self._inner.touch(key, *(() if info is None else (info,)))

    def insert(self, key, info=None):
        return self._inner.insert(key, *(() if info is None else (info,)))

    def remove(self, key):
        self._inner.remove(key)

    def evict(self, n, protected=()):
        return self._inner.evict(n, protected)

    def begin(self):
        self._inner.begin()

    def finish(self):
        self._inner.finish()

    def on_miss(self, keys):
        self._inner.on_miss(keys)


def test_a_request_scoped_python_policy_is_vllms_cpu_tier(registry):
    register_policy(RequestScopedLRU, "vLLM's LRU through Python")
    assert POLICIES["python-vllm-lru"].semantics == ("exclusive", "vllm")
    records = random_prefix_trace(4, n_requests=200)
    for cpu, cold in ((6, 0), (15, 40)):
        config = dict(gpu_blocks=5, cpu_blocks=cpu, cold_blocks=cold, semantics="vllm")
        assert (simulate(records, SimConfig(policy="python-vllm-lru", **config))
                == simulate(records, SimConfig(policy="lru", **config))), config


def test_registering_is_checked(registry):
    register_policy(PythonLRU, "LRU in Python")
    with pytest.raises(ValueError, match="'python-lru' is already registered"):
        register_policy(PythonLRU, "again")
    with pytest.raises(ValueError, match="takes a CachePolicy subclass"):
        register_policy(VllmLRU, "compiled")
    with pytest.raises(ValueError, match="needs its own class attribute `name`"):
        register_policy(type("Nameless", (CachePolicy,), {}), "no name")
    with pytest.raises(ValueError, match="must be one of lru, arc, s3fifo, priority, belady, "
                                         "python-lru, got 'nope'"):
        SimConfig(gpu_blocks=1, policy="nope")
