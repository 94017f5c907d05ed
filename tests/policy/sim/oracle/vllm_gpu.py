"""vLLM 0.33's GPU prefix cache (``BlockPool`` and its free-block queue), for the vLLM flow.

Requests are served one at a time and instantly, so between requests every cached block sits
in the free queue, least recently released at the head. Per request (:meth:`serve`):

* the prompt's leading cached blocks (the hits) are taken out of the queue, each hash's oldest
  copy, so the allocations below cannot evict them;
* every other full block is computed (or loaded from a lower tier) into a block taken from the
  head of the queue, which loses the hash it cached, if any;
* the finished request's blocks go back to the queue's tail in reverse order, so its tail is
  evicted before its head (``KVCacheManager.free`` frees in reverse).

Two rules come from vLLM's need to compute at least the prompt's last token (for its logits),
with GPU hits aligned to blocks: the GPU serves at most ``(prompt_tokens - 1) // block_tokens``
blocks of a prompt (:func:`hit_limit`; the connector may still load the next one from a lower
tier), and a block past that limit is written into a fresh block even when it is cached, so
its hash then has two copies until one is evicted. A partial last block is never cached
(:func:`cacheable_blocks`). A test checks per-request hits equal vLLM's
own ``KVCacheManager`` on the same block streams.

With a ``passes`` filter (kvtier's prefix-cache sighting filter) a written block whose hash
fails it caches nothing: it holds its block while the request runs, and the block is then
freed to the head of the queue (vLLM's ``free_blocks`` prepends blocks without a hash), so it
is the next one reused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from kvtier.policy.sim.policies.base import checked_capacity


def hit_limit(prompt_tokens: int, block_tokens: int, blocks: int) -> int:
    """Blocks of a prompt the GPU prefix cache may serve: the last token is computed."""
    return max(0, min(blocks, (prompt_tokens - 1) // block_tokens))


def cacheable_blocks(prompt_tokens: int, block_tokens: int, blocks: int) -> int:
    """Full blocks of a prompt (a partial last block is computed, never cached)."""
    return max(0, min(blocks, prompt_tokens // block_tokens))


class VllmGpuPool:
    """Physical blocks of the GPU pool, the hashes they cache, and the free queue."""

    def __init__(self, capacity_blocks: int | None, passes=None) -> None:
        self.capacity_blocks = checked_capacity(capacity_blocks)
        self.passes = passes  # hash -> whether a written block caches it (None: always)
        # block -> hash (None: freed without one); head goes first
        self._queue: OrderedDict[int, int | None] = OrderedDict()
        self._copies: dict[int, list[int]] = {}  # hash -> its blocks, oldest first
        self._blocks = 0  # blocks ever handed out (ids), <= capacity

    def __contains__(self, key: int) -> bool:
        return key in self._copies

    def __len__(self) -> int:
        """Distinct hashes cached."""
        return len(self._copies)

    def __iter__(self) -> Iterator[int]:
        return iter(self._copies)

    def serve(self, hashes: Sequence[int], hits: int, cacheable: int) -> list[int]:
        """One request: ``hashes[:hits]`` are cached and reused, ``hashes[hits:cacheable]``
        are written into fresh blocks. Returns the hashes whose last copy was evicted."""
        held: list[tuple[int, int]] = []
        for h in hashes[:hits]:
            block = self._copies[h][0]
            del self._queue[block]
            held.append((block, h))
        victims: list[int] = []
        unhashed: list[int] = []
        for h in hashes[hits:cacheable]:
            block = self._allocate(victims)
            if block is None:  # every block is held by this request: nothing more is cached
                break
            if self.passes is not None and not self.passes(h):
                unhashed.append(block)
                continue
            self._copies.setdefault(h, []).append(block)
            held.append((block, h))
        for block, h in reversed(held):
            self._queue[block] = h
        for block in unhashed:  # prepended tail first: the request's last at the head
            self._queue[block] = None
            self._queue.move_to_end(block, last=False)
        return victims

    def _allocate(self, victims: list[int]) -> int | None:
        if self.capacity_blocks is None or self._blocks < self.capacity_blocks:
            self._blocks += 1
            return self._blocks - 1
        if not self._queue:
            return None
        block, old = self._queue.popitem(last=False)
        if old is None:
            return block
        copies = self._copies[old]
        copies.remove(block)
        if not copies:
            del self._copies[old]
            victims.append(old)
        return block
