"""What can happen to a KV block, and where it can be: the schema's two vocabularies.

:class:`Tier` names where a block lives, :class:`Outcome` what happened to it; the record
types in :mod:`kvtier.collector.events` carry them, and the store keeps them as DuckDB enums
by their labels. Block hashes are unsigned 64-bit integers (:func:`block_hash_from_bytes`
folds an engine's byte digest). Standard library only: engines' plug-ins import it.
"""

from __future__ import annotations

import enum

UINT64_MAX = 2**64 - 1


class Tier(enum.IntEnum):
    """Where a block lives. Only ``GPU`` is on the compute path."""

    GPU = 0
    CPU = 1
    COLD = 2

    @property
    def label(self) -> str:
        return self.name.lower()


class Outcome(enum.IntEnum):
    """What happened to a block.

    The first four are lookup outcomes, one per block a request needs:
    served from GPU, promoted from CPU, promoted from the cold tier (through CPU), or
    recomputed by prefill. The rest are movements and bookkeeping.
    """

    GPU_HIT = 0
    CPU_PROMOTION = 1
    COLD_PROMOTION = 2
    RECOMPUTE_MISS = 3
    STORE = 4
    EVICT = 5
    DROP = 6
    PRIORITY_UPDATE = 7

    @property
    def label(self) -> str:
        return self.name.lower()


LOOKUP_OUTCOMES = frozenset(
    {Outcome.GPU_HIT, Outcome.CPU_PROMOTION, Outcome.COLD_PROMOTION, Outcome.RECOMPUTE_MISS}
)


def block_hash_from_bytes(digest: bytes) -> int:
    """Fold a byte digest to the schema's uint64 hash: its last 8 bytes, big-endian."""
    return int.from_bytes(digest[-8:], "big")
