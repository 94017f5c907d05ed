"""Runs in the vLLM side environment (see tests/probes/vllm/side_env.sh): replays prefix
traces through vLLM 0.33's own GPU prefix cache (``KVCacheManager`` over its ``BlockPool``
and ``FreeKVCacheBlockQueue``) and prints each request's computed (cached) blocks.

Input on stdin, a JSON list of cases ``{"num_gpu_blocks": N, "block_size": B, "requests":
[[id, ...], ...]}``. Output: per case, a JSON list with the number of leading blocks vLLM
found cached for each request (``num_computed_tokens // B`` from ``get_computed_blocks``),
as vLLM counts them: a fully cached prompt of n blocks reports n - 1, since vLLM recomputes
at least its last token (and then recomputes that whole block into a fresh block popped from
the free queue); the comparison on the simulator's side accounts for it.

Requests are served one at a time, in the scheduler's order for a prompt that fits in one
step: ``get_computed_blocks``, ``allocate_slots`` for the uncached tokens (which touches the
hits, pops new blocks from the head of the free queue and caches the full blocks), then
``free`` (which returns the blocks tail first). There is no concurrency and no decode token,
so the only state carried between requests is the pool itself.

Block ids to hashes: each prompt is made of full blocks, and block ``i`` holds ``B`` copies
of the token ``id_i``. vLLM's own request block hasher (sha256, chained on the parent hash)
then hashes the blocks, so nothing about hashing is bypassed. A chained hash names the
whole prefix, so our ids map one-to-one to vLLM hashes exactly when every id always follows
the same parent (ids of a trie, as ``random_prefix_trace`` builds); :func:`check_chained`
rejects a trace that breaks this rather than report hits the trace does not mean.

Capacity: vLLM takes block 0 of the pool as its null block, so ``num_gpu_blocks`` N leaves
N - 1 blocks for the cache. A prompt longer than that cannot be allocated and is an error.

With ``--gpu-sightings N``, kvtier's prefix-cache sighting filter (``probes/vllm/gpu_filter.py``,
what kvtier's connector installs in the engine) wraps vLLM's ``BlockPool`` first, and each
request is counted before its lookup, as the connector counts it; each case starts with an
empty tracker.
"""

import json
import sys

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.request import Request

from kvtier.probes.vllm import gpu_filter  # kvtier's checkout is on the path (the test puts it)

MAX_MODEL_LEN = 1 << 16


def main() -> None:
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    sightings = None
    if "--gpu-sightings" in sys.argv:
        sightings = gpu_filter.install(int(sys.argv[sys.argv.index("--gpu-sightings") + 1]))
    json.dump([replay(case, hash_fn, sightings) for case in json.load(sys.stdin)], sys.stdout)


def replay(spec: dict, hash_fn, sightings=None) -> list[int]:
    block_size, num_gpu_blocks = spec["block_size"], spec["num_gpu_blocks"]
    check_chained(spec["requests"])
    manager = make_manager(num_gpu_blocks, block_size)
    hasher = get_request_block_hasher(block_size, hash_fn)
    if sightings is not None:
        sightings.counts.clear()
    return [serve(manager, make_request(f"r{i}", ids, block_size, hasher), block_size)
            for i, ids in enumerate(spec["requests"])]


def check_chained(requests: list[list[int]]) -> None:
    """Each id must always follow the same parent, or ids and chained hashes disagree."""
    parent_of: dict[int, int | None] = {}
    for ids in requests:
        for parent, block_id in zip([None, *ids], ids):
            if parent_of.setdefault(block_id, parent) != parent:
                raise ValueError(f"id {block_id} follows {parent} and {parent_of[block_id]}: "
                                 "ids must name whole prefixes (trie nodes)")


def make_manager(num_gpu_blocks: int, block_size: int) -> KVCacheManager:
    """One full-attention group, prefix caching on, nothing else: a plain decoder's cache."""
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    config = KVCacheConfig(num_blocks=num_gpu_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    return KVCacheManager(config, max_model_len=MAX_MODEL_LEN, scheduler_block_size=block_size,
                          hash_block_size=block_size, enable_caching=True)


def make_request(request_id: str, ids: list[int], block_size: int, hasher) -> Request:
    tokens = [token for block_id in ids for token in [block_id] * block_size]
    return Request(request_id, tokens, SamplingParams(max_tokens=1), None,
                   block_hasher=hasher)


def serve(manager: KVCacheManager, request: Request, block_size: int) -> int:
    """One request alone: look up, allocate its prompt, free it. Returns its cached blocks."""
    gpu_filter.sight(request)  # a no-op unless the filter is installed
    computed, num_computed_tokens, _ = manager.get_computed_blocks(request)
    new_blocks = manager.allocate_slots(request, request.num_tokens - num_computed_tokens,
                                        num_new_computed_tokens=num_computed_tokens,
                                        new_computed_blocks=computed)
    if new_blocks is None:
        raise ValueError(f"{request.request_id}: {request.num_tokens} tokens do not fit in "
                         f"{manager.block_pool.num_gpu_blocks - 1} usable blocks")
    manager.free(request)
    return num_computed_tokens // block_size


if __name__ == "__main__":
    main()
