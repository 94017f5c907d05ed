"""The compiled replay core against the pure-Python oracle (tests/policy/sim/oracle/): the same
totals, per-request outcomes and events on random prefix traces, for every semantics, policy,
capacity shape, store threshold and priority rule, and on the bundled Mooncake trace."""

import random

import pytest

from kvtier.collector.events import Outcome
from kvtier.policy.readers import MooncakeReader
from kvtier.policy.sim.config import SEMANTICS, PriorityRule, SimConfig
from kvtier.policy.sim.policies import POLICIES, policy_names
from kvtier.policy.sim.simulator import Simulator, simulate
from tests.policy.sim.oracle import POLICIES as ORACLE_POLICIES
from tests.policy.sim.oracle.simulator import Simulator as OracleSimulator
from tests.policy.sim.simtools import random_prefix_trace, request

CAPACITIES = (0, 1, 3, 8, 20, None)
# every compiled policy the registry holds, under each semantics it runs under
COMPILED = {semantics: policy_names("vllm" if semantics == "vllm" else "exclusive",
                                    compiled=True) for semantics in SEMANTICS}


def test_every_registered_compiled_policy_has_an_oracle():
    missing = [name for name in policy_names(compiled=True) if name not in ORACLE_POLICIES]
    assert not missing, (f"compiled policies without a pure-Python oracle in "
                         f"tests/policy/sim/oracle/: {', '.join(missing)}")


def random_config(rng):
    semantics = rng.choice(SEMANTICS)
    policies = COMPILED[semantics]
    gpu, cpu, cold = rng.choice(CAPACITIES), rng.choice((0, 2, 5, 13, 40, None)), \
        rng.choice((0, 3, 10, 50, None))
    threshold = rng.choice((0, 2, 3)) if semantics != "trtllm" else 0
    if semantics == "trtllm" or (semantics == "vllm" and (cpu == 0 or threshold >= 2)):
        cold = 0
    policy = rng.choice(policies)
    if policy == "arc" and semantics == "exclusive" and None in (gpu, cpu, cold):
        policy = "lru"  # ARC's ghost bounds need a finite capacity in every tier
    return SimConfig(gpu_blocks=gpu, cpu_blocks=cpu, cold_blocks=cold, semantics=semantics,
                     policy=policy, store_threshold=threshold,
                     gpu_sightings=(rng.choice((0, 0, 2, 3)) if semantics != "trtllm" else 0),
                     offload_min_priority=rng.choice((20, 30, 35)),
                     offload_comparison=rng.choice(("ge", "gt")),
                     priorities=PriorityRule(default_priority=rng.choice((10, 35, 60)),
                                             prefix_blocks=rng.choice((0, 2, 5)),
                                             prefix_priority=rng.choice((20, 30, 90))))


@pytest.mark.parametrize("seed", range(1, 31))
def test_totals_equal_the_oracle_on_random_traces(seed):
    rng = random.Random(seed)
    records = random_prefix_trace(seed, n_requests=250, max_blocks=rng.choice((6, 14, 30)))
    for _ in range(8):
        config = random_config(rng)
        assert simulate(records, config) == OracleSimulator(config).replay(records), config


@pytest.mark.parametrize("seed", range(1, 7))
def test_each_request_and_each_event_equal_the_oracle(seed):
    rng = random.Random(100 + seed)
    records = random_prefix_trace(seed, n_requests=120)
    for _ in range(4):
        config = random_config(rng)
        ours_events, theirs_events = [], []
        ours = Simulator(config, events=ours_events.append)
        theirs = OracleSimulator(config, events=theirs_events.append)
        for record in records:
            a, b = ours.serve(record), theirs.serve(record)
            assert a.outcomes == b.outcomes, config
            assert (a.gpu_hit_tokens, a.cpu_promotion_tokens, a.cold_promotion_tokens,
                    a.recompute_tokens) == (b.gpu_hit_tokens, b.cpu_promotion_tokens,
                                            b.cold_promotion_tokens, b.recompute_tokens)
        assert ours.result == theirs.result
        assert ours_events == theirs_events, config


@pytest.mark.parametrize("semantics, policy", [
    (semantics, name) for name in policy_names(compiled=True) if not POLICIES[name].uses_future
    for semantics in POLICIES[name].semantics])
def test_totals_equal_the_oracle_on_the_mooncake_trace(semantics, policy, mooncake_path):
    records = list(MooncakeReader(mooncake_path).requests())[:3000]
    config = SimConfig(gpu_blocks=500, cpu_blocks=2000,
                       cold_blocks=0 if semantics == "trtllm" else 8000,
                       semantics=semantics, policy=policy)
    assert simulate(records, config) == OracleSimulator(config).replay(records)


def test_belady_replays_equal_the_oracle_with_the_future():
    records = random_prefix_trace(9, n_requests=300)
    config = SimConfig(gpu_blocks=6, cpu_blocks=15, cold_blocks=30, policy="belady")
    assert simulate(records, config) == OracleSimulator(config).replay(records)


def test_outcomes_of_a_chunked_replay_equal_the_ones_served_one_by_one():
    records = random_prefix_trace(4, n_requests=300)
    config = SimConfig(gpu_blocks=8, cpu_blocks=20, semantics="vllm")
    seen = []
    Simulator(config).replay(records, on_request=lambda r, o: seen.append(o))
    one_by_one = Simulator(config)
    assert seen == [one_by_one.serve(r) for r in records]
    assert all(o.outcomes.count(Outcome.RECOMPUTE_MISS) >= 0 for o in seen)


def test_a_repeated_block_inside_a_request_is_a_clear_error():
    """vLLM's pool holds one copy per hit: ids that repeat inside a prompt are not prefix
    chained, and the vLLM flow says so rather than corrupt its queue."""
    sim = Simulator(SimConfig(gpu_blocks=8, semantics="vllm"))
    sim.serve(request([1, 2], prompt_tokens=12))
    with pytest.raises(ValueError, match="repeats within one request"):
        sim.serve(request([1, 2, 1, 2], prompt_tokens=17))


def test_a_compiled_policy_joins_with_one_registry_line(monkeypatch, capsys):
    """Beside its Cython class and its oracle module, a compiled policy is one ``PolicySpec``
    line: the simulator, ``simulate``'s and ``evaluate``'s choices and this file's replays
    against the oracle then take it (here the LRU core under a second name)."""
    from kvtier.cli import main
    from kvtier.policy.sim.policies import PolicySpec, compiled_policy

    spec = PolicySpec(compiled_policy("lru-again", "Lru"), "LRU under a second name")
    monkeypatch.setitem(POLICIES, spec.name, spec)
    monkeypatch.setitem(ORACLE_POLICIES, spec.name, ORACLE_POLICIES["lru"])
    assert spec.compiled and "lru-again" in policy_names("exclusive", evaluate=True, compiled=True)
    records = random_prefix_trace(3, n_requests=200)
    config = SimConfig(gpu_blocks=6, cpu_blocks=15, cold_blocks=30, policy="lru-again")
    ours = simulate(records, config)
    assert ours == OracleSimulator(config).replay(records)
    assert ours == simulate(records, SimConfig(gpu_blocks=6, cpu_blocks=15, cold_blocks=30))
    for verb in ("simulate", "evaluate"):
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        assert "lru-again" in capsys.readouterr().out
