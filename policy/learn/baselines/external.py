"""libCacheSim's LRU, alone and behind its Bloom-filter admission, on the same block stream.

kvtier's policies run in tiers (GPU LRU, then the CPU policy); libCacheSim's run as one cache
of the two tiers' combined size, fed every block reference in replay order with unit-size
objects and the request's arrival time as the clock. A request is served by the leading run
of hits (prefix-contiguous, as in kvtier's lookup), counted in tokens over the same
evaluation window. Two exclusive LRU tiers behave nearly like one LRU of their combined size,
so the ``lcs:lru`` row checks that both count the same thing: equal on the Mooncake trace and
on synthetic conversations; on the WEKA subset 0.08 points apart, because kvtier pins a
request's GPU hits before placing its other blocks (as an engine does) where libCacheSim
touches them in prompt order, which reorders recency inside long prompts.

libCacheSim is an optional dependency (``pip install libcachesim``); asking for these rows
without it is a ``ValueError`` saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtier.collector.events import RequestRecord

# row name -> (libCacheSim class, admissioner class or None)
EXTERNAL = {
    "lcs:lru": ("LRU", None),
    "lcs:lru+bloom": ("LRU", "BloomFilterAdmissioner"),  # admit on the second request
}
OBJ_ID_MASK = (1 << 63) - 1  # block hashes are unsigned 64-bit; libCacheSim ids signed


def external_rows(records: Sequence[RequestRecord], count_from: int, capacity_blocks: int,
                  names: Sequence[str], *,
                  progress: Callable[[str], None] | None = None, trace=None) -> list[dict]:
    """One row per name in :data:`EXTERNAL`: ``token_hit_ratio``, ``hit_tokens``,
    ``prompt_tokens`` over requests ``count_from`` onwards (earlier ones only warm).
    ``trace``: the records' blocks as arrays (a ``BlockTrace``), when they carry none."""
    unknown = [n for n in names if n not in EXTERNAL]
    if unknown:
        raise ValueError(f"unknown libCacheSim policies {', '.join(unknown)}; allowed: "
                         f"{', '.join(EXTERNAL)}")
    try:
        import libcachesim
    except ImportError:
        raise ValueError("the libCacheSim comparison needs the libcachesim package "
                         "(pip install libcachesim)") from None
    rows = []
    for name in names:
        if progress is not None:
            progress(name)
        cache = _cache(libcachesim, name, capacity_blocks)
        hit, prompt = _replay(libcachesim, cache, records, count_from, trace)
        rows.append({"policy": name, "token_hit_ratio": hit / prompt if prompt else 0.0,
                     "hit_tokens": hit, "prompt_tokens": prompt,
                     "capacity_blocks": capacity_blocks})
    return rows


def _cache(lcs, name: str, capacity_blocks: int):
    cls_name, admissioner = EXTERNAL[name]
    kwargs = {"cache_size": capacity_blocks}
    if admissioner is not None:
        kwargs["admissioner"] = getattr(lcs, admissioner)()
    return getattr(lcs, cls_name)(**kwargs)


def _replay(lcs, cache, records: Sequence[RequestRecord], count_from: int, trace=None
            ) -> tuple[int, int]:
    request = lcs.Request()
    request.obj_size = 1
    hit_tokens = prompt_tokens = 0
    for index, record in enumerate(records):
        request.clock_time = int(record.arrival_s)
        block_tokens = record.block_size_tokens or 16
        leading = True
        hits = 0
        blocks = record.block_hashes if trace is None else trace.blocks(index).tolist()
        for position, h in enumerate(blocks):
            request.obj_id = h & OBJ_ID_MASK
            hit = cache.get(request)
            if leading and hit:
                hits += max(0, min(block_tokens,
                                   record.prompt_tokens - position * block_tokens))
            else:
                leading = False
        if index >= count_from:
            hit_tokens += hits
            prompt_tokens += record.prompt_tokens
    return hit_tokens, prompt_tokens
