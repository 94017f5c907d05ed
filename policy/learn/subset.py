"""Smaller views of a trace for fast replays: the first requests, and coarser blocks.

Coarsening keeps prefix identity exact: with prefix-chained ids, the id of fine block ``i``
names the whole prefix up to it, so keeping every ``factor``-th id (and the last one) gives
the ids of ``factor`` times larger blocks over the same prompts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

from kvtier.collector.events import RequestRecord


def coarsen(record: RequestRecord, factor: int) -> RequestRecord:
    """``record`` with blocks ``factor`` times larger (the last one may be partial)."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"factor must be an int >= 1, got {factor!r}")
    if factor == 1 or not record.block_hashes:
        return record
    hashes = record.block_hashes
    kept = hashes[factor - 1::factor]
    if len(hashes) % factor:
        kept += (hashes[-1],)
    size = record.block_size_tokens * factor if record.block_size_tokens else None
    return dataclasses.replace(record, block_hashes=kept, block_size_tokens=size)


def limited(records: Iterable[RequestRecord], max_requests: int | None = None,
            factor: int = 1) -> Iterator[RequestRecord]:
    """The first ``max_requests`` records (all when ``None``), coarsened by ``factor``."""
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {max_requests!r}")
    for index, record in enumerate(records):
        if max_requests is not None and index >= max_requests:
            return
        yield coarsen(record, factor)
