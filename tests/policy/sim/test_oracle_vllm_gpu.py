"""Cross-check against vLLM 0.33's own GPU prefix cache (``KVCacheManager``, ``BlockPool``,
``FreeKVCacheBlockQueue``): with ``semantics="vllm"`` and no CPU tier, the simulator finds,
request by request, the GPU prefix hits vLLM finds on the same prefix traces, served one at
a time with full-block prompts. vLLM runs in the side environment built by
``tests/probes/vllm/side_env.sh`` (``KVTIER_VLLM_PYTHON`` or /tmp/kvt-vllm-side); skipped
without it.

vLLM's null block is accounted for here: its pool of ``num_gpu_blocks`` N keeps block 0 as a
placeholder, so the simulator gets ``gpu_blocks = N - 1``. Everything else is the simulator's
own model (``policy/sim/vllm_gpu.py``): a finished request released tail first, at most
``n - 1`` of a full ``n``-block prompt served from the GPU (vLLM computes the last token), and
that last block recomputed into a fresh block taken from the free queue's head even when it
is cached (a second copy), which evicts the least recently used block.

``unique_tails`` gives every prompt a block of its own at the end (a user turn no one else
sends), so no prompt is ever fully cached: on those traces the comparison tests eviction order
alone. Capacities are small (a prompt has up to 13 blocks) so chains are evicted all the time;
the same traces under ``exclusive`` (plain LRU, head first) must disagree with vLLM.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from tests.policy.sim.simtools import random_prefix_trace, request

from kvtier.collector.events import Outcome
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.simulator import Simulator

SIDE_PYTHON = os.environ.get("KVTIER_VLLM_PYTHON", "/tmp/kvt-vllm-side/bin/python")
ORACLE = Path(__file__).with_name("vllm_gpu_oracle.py")
ROOT = Path(__file__).resolve().parents[3]  # kvtier's checkout: the oracle imports its filter
pytestmark = pytest.mark.skipif(not Path(SIDE_PYTHON).exists(), reason="no vLLM side environment")

BLOCK_TOKENS = 4
SEEDS = (1, 2, 3, 4)
NUM_GPU_BLOCKS = (14, 16, 20, 32)  # vLLM's pool sizes, null block included
TAIL_CASES = [("tails", seed, n) for seed in SEEDS for n in NUM_GPU_BLOCKS]
RAW_CASES = [("raw", seed, n) for seed in SEEDS for n in NUM_GPU_BLOCKS]
# The smallest trace on which vLLM's recomputed last block changes a later hit (8-block
# pool: 7 usable). [4] is fully cached, so vLLM recomputes it into the head of its free
# queue, the block holding 3, and [3, 109] misses.
SMALLEST = ("smallest", 0, 8)
SMALLEST_TRACE = [[3], [4, 153, 154, 155, 156, 157], [4], [3, 109]]


def full_block_trace(seed):
    """``random_prefix_trace``'s block ids, every prompt made of whole blocks."""
    return [list(r.block_hashes) for r in random_prefix_trace(seed, block_tokens=BLOCK_TOKENS)]


def unique_tails(trace):
    """Each prompt followed by a block no other prompt has: a new leaf of the trie."""
    first = 1 + max(max(ids) for ids in trace)
    return [ids + [first + i] for i, ids in enumerate(trace)]


def traces():
    found = {SMALLEST: SMALLEST_TRACE}
    for kind, seed, n in RAW_CASES + TAIL_CASES:
        trace = full_block_trace(seed)
        found[kind, seed, n] = unique_tails(trace) if kind == "tails" else trace
    return found


def our_hits(trace, num_gpu_blocks, semantics="vllm", gpu_sightings=0):
    """GPU hit blocks per request."""
    config = SimConfig(gpu_blocks=num_gpu_blocks - 1, cpu_blocks=0, semantics=semantics,
                       gpu_sightings=gpu_sightings)
    simulator = Simulator(config)
    records = (request(ids, block_tokens=BLOCK_TOKENS, rid=f"r{i}", t=float(i))
               for i, ids in enumerate(trace))
    return [simulator.serve(r).outcomes.count(Outcome.GPU_HIT) for r in records]


def vllm_run(cases: dict, *options: str) -> dict:
    specs = [{"num_gpu_blocks": case[2], "block_size": BLOCK_TOKENS, "requests": trace}
             for case, trace in cases.items()]
    done = subprocess.run([SIDE_PYTHON, str(ORACLE), *options], input=json.dumps(specs),
                          text=True, capture_output=True, timeout=300, check=False,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(zip(cases, json.loads(done.stdout)))


@pytest.fixture(scope="module")
def vllm_hits():
    cases = traces()
    return cases, vllm_run(cases)


@pytest.fixture(scope="module")
def vllm_filtered_hits():
    """vLLM's hits with kvtier's GPU sighting filter installed in its block pool."""
    cases = traces()
    return cases, vllm_run(cases, "--gpu-sightings", "2")


def _case_id(case):
    return f"{case[0]}-seed{case[1]}-blocks{case[2]}"


@pytest.mark.parametrize("case", TAIL_CASES, ids=_case_id)
def test_gpu_hits_equal_vllm_when_no_prompt_is_fully_cached(vllm_hits, case):
    cases, expected = vllm_hits
    assert our_hits(cases[case], case[2]) == expected[case]


@pytest.mark.parametrize("case", RAW_CASES, ids=_case_id)
def test_gpu_hits_equal_vllm_request_by_request(vllm_hits, case):
    cases, expected = vllm_hits
    assert our_hits(cases[case], case[2]) == expected[case]


def test_fully_cached_prompt_evicts_in_vllm(vllm_hits):
    """Store 3; a 6-block prompt fills the rest; [4] is fully cached: vLLM recomputes its
    block into the free queue's head, evicting 3, so [3, 109] misses: 0 0 0 0."""
    cases, expected = vllm_hits
    assert expected[SMALLEST] == [0, 0, 0, 0]
    assert our_hits(cases[SMALLEST], SMALLEST[2]) == expected[SMALLEST]


def test_head_first_release_disagrees_with_vllm(vllm_hits):
    """Plain LRU (the old release order) misses what vLLM keeps, so the equality above
    depends on releasing tail first."""
    cases, expected = vllm_hits
    differing = [case for case in TAIL_CASES
                 if our_hits(cases[case], case[2], "exclusive") != expected[case]]
    assert differing


@pytest.mark.parametrize("case", RAW_CASES + TAIL_CASES, ids=_case_id)
def test_gpu_hits_equal_vllm_with_kvtiers_gpu_sighting_filter(vllm_filtered_hits, case):
    """kvtier's prefix-cache filter, as its connector installs it in vLLM's block pool, serves
    what the simulator's vLLM flow with ``gpu_sightings=2`` serves, request by request."""
    cases, expected = vllm_filtered_hits
    assert our_hits(cases[case], case[2], gpu_sightings=2) == expected[case]


def test_the_gpu_sighting_filter_changes_what_vllm_serves(vllm_hits, vllm_filtered_hits):
    cases, plain = vllm_hits
    _, filtered = vllm_filtered_hits
    changed = [case for case in RAW_CASES + TAIL_CASES if plain[case] != filtered[case]]
    assert changed == RAW_CASES + TAIL_CASES  # the traces reuse blocks on their second request
