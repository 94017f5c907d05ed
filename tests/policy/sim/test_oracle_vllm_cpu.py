"""Cross-check against vLLM 0.33's own ``CPUOffloadingManager`` (``lru`` and ``arc``): the
simulator's vLLM flow with a CPU tier only finds, request by request, the prefix hits vLLM
finds on the same block streams. vLLM runs in the side environment built by
``tests/probes/vllm/side_env.sh`` (``KVTIER_VLLM_PYTHON`` or /tmp/kvt-vllm-side); skipped
without it."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from tests.policy.sim.simtools import random_prefix_trace

from kvtier.collector.events import Outcome
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.policies import policy_names
from kvtier.policy.sim.simulator import Simulator

SIDE_PYTHON = os.environ.get("KVTIER_VLLM_PYTHON", "/tmp/kvt-vllm-side/bin/python")
ORACLE = Path(__file__).with_name("vllm_cpu_oracle.py")
pytestmark = pytest.mark.skipif(not Path(SIDE_PYTHON).exists(), reason="no vLLM side environment")

CASES = [(policy, seed, capacity, threshold)
         for policy in policy_names("vllm", compiled=True) for seed in (1, 2, 3)
         for capacity in (8, 20, 60) for threshold in (0, 2)]


def full_blocks(record):
    """The blocks vLLM would see: its full blocks (a partial last block is never offloaded,
    and the simulator's vLLM flow neither stores nor finds it)."""
    return list(record.block_hashes[:record.prompt_tokens // record.block_size_tokens])


def our_hits(records, policy, capacity, threshold):
    config = SimConfig(gpu_blocks=0, cpu_blocks=capacity, semantics="vllm", policy=policy,
                       store_threshold=threshold)
    simulator = Simulator(config)
    return [simulator.serve(r).outcomes.count(Outcome.CPU_PROMOTION) for r in records]


@pytest.fixture(scope="module")
def vllm_hits():
    traces = {seed: random_prefix_trace(seed) for seed in (1, 2, 3)}
    cases = [{"capacity": c, "policy": p, "store_threshold": t,
              "requests": [full_blocks(r) for r in traces[s]]} for p, s, c, t in CASES]
    done = subprocess.run([SIDE_PYTHON, str(ORACLE)], input=json.dumps(cases), text=True,
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return traces, dict(zip(CASES, json.loads(done.stdout)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_cpu_tier_hits_equal_vllm_request_by_request(vllm_hits, case):
    traces, expected = vllm_hits
    policy, seed, capacity, threshold = case
    assert our_hits(traces[seed], policy, capacity, threshold) == expected[case]
