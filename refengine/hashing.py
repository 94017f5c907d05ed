"""Prefix-chained block hashes: a block's id depends on its tokens and on every block before it."""

from __future__ import annotations

import hashlib
import struct
from typing import Sequence

from kvtier.collector.block_kinds import block_hash_from_bytes

_ROOT = b"kvtier-reference-engine"


def block_hash(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """uint64 id of a block: BLAKE2b over the parent's id and the block's token ids, folded
    the schema's way (last 8 bytes, big-endian). ``parent_hash=None`` for the first block."""
    digest = hashlib.blake2b(_ROOT, digest_size=32)
    digest.update(b"\x00" if parent_hash is None else b"\x01" + parent_hash.to_bytes(8, "big"))
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return block_hash_from_bytes(digest.digest())


def chain_hashes(token_ids: Sequence[int], block_size_tokens: int, *,
                 include_partial: bool = False) -> list[int]:
    """Hashes of every full block of ``token_ids`` in order (and of the partial last one,
    if asked: the trace schema's block ids cover the whole prompt)."""
    hashes: list[int] = []
    parent = None
    stop = len(token_ids) if include_partial else len(token_ids) - block_size_tokens + 1
    for start in range(0, max(stop, 0), block_size_tokens):
        parent = block_hash(parent, token_ids[start:start + block_size_tokens])
        hashes.append(parent)
    return hashes
