"""Cross-check against vLLM 0.33's own GPU prefix cache (``KVCacheManager``, ``BlockPool``,
``FreeKVCacheBlockQueue``): with ``semantics="vllm"`` and no CPU tier, the simulator finds,
request by request, the GPU prefix hits vLLM finds on the same prefix traces, served one at
a time with full-block prompts. vLLM runs in the side environment built by
``tests/probes/vllm_side_env.sh`` (``KVTIER_VLLM_PYTHON`` or /tmp/kvt-vllm-side); skipped
without it.

Two of vLLM's details are accounted for here, in the open:

* the null block: vLLM's pool of ``num_gpu_blocks`` N keeps block 0 as a placeholder, so the
  simulator gets ``gpu_blocks = N - 1``;
* the last prompt block: when a whole prompt is cached vLLM still recomputes its last token
  to get logits, and its hits are block aligned, so it reports at most ``n - 1`` of a prompt's
  ``n`` blocks. The simulator counts the cached last block as a hit, so every comparison caps
  our count at ``n - 1`` (``reported_by_vllm``).

The rule has a second effect that the cap cannot account for, and the simulator does not
model it: vLLM recomputes that last block into a block popped from the head of its free
queue, evicting the least recently used cached block, and keeps the old copy as a duplicate.
Later hits then differ (``test_fully_cached_prompt_evicts_in_vllm``), so the comparison on
the raw traces is an expected failure where it bites. ``unique_tails`` gives every prompt a
block of its own at the end (a user turn no one else sends), so no prompt is ever fully
cached: on those traces the comparison tests eviction order alone, and must hold exactly.

Capacities are small (a prompt has up to 13 blocks) so chains are evicted all the time; vLLM
frees a finished request's blocks in reverse, tail first, and the same traces under
``exclusive`` (plain LRU, head first) must disagree with it.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from simtools import random_prefix_trace, request

from collector.events import Outcome
from policy.sim.config import SimConfig
from policy.sim.simulator import Simulator

SIDE_PYTHON = os.environ.get("KVTIER_VLLM_PYTHON", "/tmp/kvt-vllm-side/bin/python")
ORACLE = Path(__file__).with_name("vllm_gpu_oracle.py")
pytestmark = pytest.mark.skipif(not Path(SIDE_PYTHON).exists(), reason="no vLLM side environment")

BLOCK_TOKENS = 4
SEEDS = (1, 2, 3, 4)
NUM_GPU_BLOCKS = (14, 16, 20, 32)  # vLLM's pool sizes, null block included
TAIL_CASES = [("tails", seed, n) for seed in SEEDS for n in NUM_GPU_BLOCKS]
RAW_CASES = [("raw", seed, n) for seed in SEEDS for n in NUM_GPU_BLOCKS]
# The smallest trace on which vLLM's recomputed last block changes a later hit (8-block
# pool: 7 usable). [4] is fully cached, so vLLM recomputes it into the head of its free
# queue, the block holding 3; the simulator counts [4] as a hit and keeps 3.
SMALLEST = ("smallest", 0, 8)
SMALLEST_TRACE = [[3], [4, 153, 154, 155, 156, 157], [4], [3, 109]]
# Raw traces where that eviction reaches a later request's hits (found by running them).
RAW_DIFFERING = {(1, 20), (1, 32), (2, 16), (2, 20), (2, 32),
                 (3, 14), (3, 16), (3, 20), (3, 32), (4, 16)}
LAST_BLOCK_REASON = ("vLLM recomputes a fully cached prompt's last block into a fresh block "
                     "(evicting its LRU free block, keeping a duplicate); the simulator counts "
                     "it as a hit and evicts nothing")


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


def our_hits(trace, num_gpu_blocks, semantics="vllm"):
    """GPU hit blocks per request, capped as vLLM reports them (see the module docstring)."""
    config = SimConfig(gpu_blocks=num_gpu_blocks - 1, cpu_blocks=0, semantics=semantics)
    simulator = Simulator(config)
    records = (request(ids, block_tokens=BLOCK_TOKENS, rid=f"r{i}", t=float(i))
               for i, ids in enumerate(trace))
    return [reported_by_vllm(simulator.serve(r).outcomes.count(Outcome.GPU_HIT),
                             len(r.block_hashes)) for r in records]


def reported_by_vllm(hit_blocks, prompt_blocks):
    """vLLM recomputes at least the last token, so a full-block prompt's last block is
    never reported as a hit."""
    return min(hit_blocks, prompt_blocks - 1)


@pytest.fixture(scope="module")
def vllm_hits():
    cases = traces()
    specs = [{"num_gpu_blocks": case[2], "block_size": BLOCK_TOKENS, "requests": trace}
             for case, trace in cases.items()]
    done = subprocess.run([SIDE_PYTHON, str(ORACLE)], input=json.dumps(specs), text=True,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return cases, dict(zip(cases, json.loads(done.stdout)))


def _case_id(case):
    return f"{case[0]}-seed{case[1]}-blocks{case[2]}"


@pytest.mark.parametrize("case", TAIL_CASES, ids=_case_id)
def test_gpu_hits_equal_vllm_when_no_prompt_is_fully_cached(vllm_hits, case):
    cases, expected = vllm_hits
    assert our_hits(cases[case], case[2]) == expected[case]


def _raw_param(case):
    if case[1:] not in RAW_DIFFERING:
        return case
    return pytest.param(case, marks=pytest.mark.xfail(strict=True, reason=LAST_BLOCK_REASON))


@pytest.mark.parametrize("case", [_raw_param(c) for c in RAW_CASES], ids=_case_id)
def test_gpu_hits_equal_vllm_request_by_request(vllm_hits, case):
    cases, expected = vllm_hits
    assert our_hits(cases[case], case[2]) == expected[case]


@pytest.mark.xfail(strict=True, reason=LAST_BLOCK_REASON)
def test_fully_cached_prompt_evicts_in_vllm(vllm_hits):
    """Store 3; a 6-block prompt fills the rest; [4] is fully cached: vLLM recomputes its
    block into the free queue's head, evicting 3, so [3, 109] misses (vLLM: 0 0 0 0). The
    simulator serves [4] as a hit and [3, 109] finds 3 (ours: 0 0 0 1)."""
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
