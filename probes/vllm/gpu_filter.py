"""kvtier's sighting filter for vLLM's GPU prefix cache: a block a request writes into vLLM's
block pool is cached (gets its hash, so a later request can reuse it) only from the
``kvtier_gpu_sightings``-th request that references it. Until then the block holds its slot
while the request runs and is freed without a hash, which vLLM's ``BlockPool.free_blocks``
puts at the head of its free queue: the next allocation reuses it and evicts nothing. One-time
prompts then take no cached slot from reused ones, as libCacheSim's LRU behind its Bloom
filter keeps them out of one cache (``kvtier evaluate``'s ``sightings-gpu`` row prices it; the
simulator's ``SimConfig.gpu_sightings`` is this rule under vLLM's semantics).

vLLM has no setting for this. kvtier's connector, on the scheduler side, installs it
(:func:`install`) when ``kv_connector_extra_config`` has ``kvtier_gpu_sightings`` >= 2: the
connector counts each request's blocks once, when the scheduler first asks it about the
request (:func:`sight`, before the prefix lookup), and ``BlockPool.cache_full_blocks`` is
wrapped to pass vLLM's own ``block_mask`` (its parameter for blocks that must stay out of the
prefix cache) with the blocks that have not been seen often enough masked out. Counting is
vLLM's ``store_threshold`` tracker's: at most ``MAX_TRACKED`` blocks, the least recently seen
forgotten first (never one of the request being counted), a forgotten block starting again.
If the filter ever fails (a vLLM that changed what it wraps), it logs once and lets vLLM cache
every block from then on: the engine keeps serving.

Runs inside the engine: imports only the standard library and vLLM.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict

logger = logging.getLogger(__name__)

MAX_TRACKED = 64000  # vLLM's store_threshold tracker size (max_tracker_size)
_SIGHTED = "_kvtier_sighted"


class Sightings:
    """How many requests referenced each tracked block hash, LRU-bounded."""

    def __init__(self, threshold: int, max_tracked: int = MAX_TRACKED) -> None:
        if threshold < 2 or max_tracked <= 0:
            raise ValueError(f"kvtier_gpu_sightings must be >= 2 (and the tracker > 0 blocks), "
                             f"got {threshold} and {max_tracked}")
        self.threshold = threshold
        self.max_tracked = max_tracked
        self.counts: OrderedDict = OrderedDict()
        self.working = True  # False once it failed: the engine then caches every block

    def count(self, hashes) -> None:
        """One request referencing ``hashes`` (each once)."""
        counts, kept = self.counts, 0
        for h in hashes:
            if h in counts:
                counts[h] += 1
                counts.move_to_end(h)
                kept += 1
        unprotected = len(counts) - kept
        for h in hashes:
            if h in counts:
                continue
            if len(counts) >= self.max_tracked:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[h] = 1

    def passes(self, h) -> bool:
        return self.counts.get(h, 0) >= self.threshold


_installed: Sightings | None = None


def install(threshold: int, max_tracked: int = MAX_TRACKED) -> Sightings:
    """Filter this process's vLLM prefix cache from now on (once per process; installing the
    same rule again is a no-op, a different one a ``ValueError``)."""
    global _installed
    if _installed is not None:
        if (_installed.threshold, _installed.max_tracked) != (threshold, max_tracked):
            raise ValueError(f"a GPU sighting filter of {_installed.threshold} sightings is "
                             f"installed in this process; cannot install {threshold}")
        return _installed
    sightings = Sightings(threshold, max_tracked)
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.cache_full_blocks

    @functools.wraps(original)
    def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks,
                          block_size, kv_cache_group_id, block_mask=None):
        # counted as the request carries them: filter where the pool caches at that size
        if (sightings.working and num_cached_blocks < num_full_blocks
                and self.hash_block_size == block_size):
            try:
                hashes = request.block_hashes[num_cached_blocks:num_full_blocks]
                mask = [sightings.passes(h) for h in hashes]
                if block_mask is not None:
                    mask = [a and b for a, b in zip(block_mask, mask)]
                block_mask = mask
            except Exception:  # fail open: cache as vLLM does, never stop the engine
                sightings.working = False
                logger.exception("kvtier's GPU sighting filter failed; vLLM caches every block "
                                 "from now on")
        return original(self, request, blocks, num_cached_blocks, num_full_blocks,
                        block_size, kv_cache_group_id, block_mask=block_mask)

    BlockPool.cache_full_blocks = cache_full_blocks
    _installed = sightings
    return sightings


def sight(request) -> None:
    """Count ``request``'s blocks, once per request (a request asked about again, or
    rescheduled after preemption, is not counted again); nothing without :func:`install`."""
    if _installed is None or not _installed.working or getattr(request, _SIGHTED, False):
        return
    try:
        setattr(request, _SIGHTED, True)
        _installed.count(request.block_hashes)
    except Exception:  # fail open, as the mask does
        _installed.working = False
        logger.exception("kvtier's GPU sighting filter failed; vLLM caches every block from now on")
