"""Token-range retention priorities per request class, from the learned block priorities.

TensorRT-LLM sets retention per request and per prompt token range, not per block, so the
learned priorities are summarised by where a block sits in the prompt: each offer (a block
at the moment a tier would admit it) falls in a prefix-depth band (``BANDS_BLOCKS``, in
blocks: the first block, blocks 1-3, 4-15, 16 and deeper), and a band's priority is the
median of its offers' priorities, on the 10-step scale. The class of an offer is the
``request_type`` of the request that created the block (``DEFAULT_CLASS`` where the trace
has none), so a system-prompt-heavy class and a long-tail class get their own ranges.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.writers.trtllm_retention import RetentionClass, TokenRange

BANDS_BLOCKS = ((0, 1), (1, 4), (4, 16), (16, None))
DEFAULT_CLASS = "default"


def band_priorities(records: Sequence[RequestRecord], priority_by_offer: dict,
                    block_tokens: int) -> dict:
    """Over every class: the median priority per band, named by token range
    (``tokens_0_512``, ..., ``tokens_8192_end``)."""
    by_band = _offers_by_band(records, priority_by_offer, lambda index: DEFAULT_CLASS)
    return {_band_name(band, block_tokens): _median(values)
            for band, values in sorted(by_band.get(DEFAULT_CLASS, {}).items())}


def retention_classes(records: Sequence[RequestRecord], priority_by_offer: dict,
                      block_tokens: int) -> tuple[RetentionClass, ...]:
    """A :class:`RetentionClass` per request class that has offers: a token range per band
    (equal neighbours merged; a band with no offers takes the priority of the band before
    it, or after it for the first), and decoded tokens at the deepest range's priority,
    since a conversation's next turn carries the answer as the deepest part of its prompt."""
    def class_of(index: int) -> str:
        return records[index].request_type or DEFAULT_CLASS

    out = []
    for name, bands in sorted(_offers_by_band(records, priority_by_offer, class_of).items()):
        medians = {band: _median(values) for band, values in bands.items()}
        filled = _fill(medians)
        ranges: list[TokenRange] = []
        for band, priority in enumerate(filled):
            lo, hi = BANDS_BLOCKS[band]
            end = None if hi is None else hi * block_tokens
            if ranges and ranges[-1].priority == priority:
                ranges[-1] = TokenRange(ranges[-1].token_start, end, priority)
            else:
                ranges.append(TokenRange(lo * block_tokens, end, priority))
        out.append(RetentionClass(name, tuple(ranges), decode_priority=ranges[-1].priority))
    return tuple(out)


def _offers_by_band(records: Sequence[RequestRecord], priority_by_offer: dict,
                    class_of) -> dict[str, dict[int, list[int]]]:
    # a prefix-chained id sits at one position, so the position of an offer is its id's
    position = {h: i for r in records for i, h in enumerate(r.block_hashes)}
    out: dict[str, dict[int, list[int]]] = {}
    for (index, key), priority in priority_by_offer.items():
        band = _band(position.get(key, 0))
        out.setdefault(class_of(index), {}).setdefault(band, []).append(priority)
    return out


def _band(depth: int) -> int:
    for band, (lo, hi) in enumerate(BANDS_BLOCKS):
        if depth >= lo and (hi is None or depth < hi):
            return band
    raise ValueError(f"prefix depth must be >= 0, got {depth}")


def _band_name(band: int, block_tokens: int) -> str:
    lo, hi = BANDS_BLOCKS[band]
    return f"tokens_{lo * block_tokens}_{'end' if hi is None else hi * block_tokens}"


def _median(values: list[int]) -> int:
    return int(round(float(np.median(values)) / 10) * 10)


def _fill(medians: dict[int, int]) -> list[int]:
    first = medians[min(medians)]
    out, last = [], first
    for band in range(len(BANDS_BLOCKS)):
        last = medians.get(band, last)
        out.append(last)
    return out


def range_priorities(records: Sequence[RequestRecord], priority_by_offer: dict,
                     classes: Sequence[RetentionClass], block_tokens: int) -> dict:
    """Each offer's priority as the token ranges assign it (its class's range at its depth):
    what TensorRT-LLM sees when the gateway sends ``classes``, for sweeping its threshold."""
    position = {h: i for r in records for i, h in enumerate(r.block_hashes)}
    by_name = {c.name: c for c in classes}
    out = {}
    for index, key in priority_by_offer:
        ranges = by_name[records[index].request_type or DEFAULT_CLASS].token_ranges
        token = position.get(key, 0) * block_tokens
        out[(index, key)] = next(r.priority for r in reversed(ranges) if r.token_start <= token)
    return out
