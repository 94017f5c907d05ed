"""Trace block ids -> token prompts that share prefixes exactly as the trace does.

Each distinct block id gets ``block_tokens`` token ids of its own, a function of that id only,
so two requests whose block-id lists share a prefix get token lists sharing the same prefix,
and no two distinct ids (within one builder) get the same tokens: ids are numbered in order of
first appearance and the number is written in base ``vocab_size`` into the block's tokens
(injective as long as the count of distinct ids stays below ``vocab_size ** block_tokens``).
A trace's partial last block becomes the same share of a block, taken from the front of that
id's tokens, so a shorter prompt is still a prefix.
"""

from __future__ import annotations

import math

from kvtier.collector.events import RequestRecord


class PromptBuilder:
    def __init__(self, block_tokens: int, vocab_size: int, *, max_blocks: int | None = None):
        if block_tokens < 1 or vocab_size < 2:
            raise ValueError(f"block_tokens must be >= 1 and vocab_size >= 2, got {block_tokens}, {vocab_size}")
        if max_blocks is not None and max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1 or None, got {max_blocks}")
        self.block_tokens, self.vocab_size, self.max_blocks = block_tokens, vocab_size, max_blocks
        self._index: dict[int, int] = {}
        self._capacity = vocab_size ** block_tokens

    def block(self, block_id: int) -> list[int]:
        """The tokens of one block id (numbered on first sight)."""
        index = self._index.setdefault(block_id, len(self._index))
        if index >= self._capacity:
            raise ValueError(f"more than {self._capacity} distinct block ids: raise block_tokens or vocab_size")
        digits = []
        for position in range(self.block_tokens):
            index, digit = divmod(index, self.vocab_size)
            # a per-position shift keeps blocks from being mostly token 0; still a bijection
            digits.append((digit + 7919 * position + 13) % self.vocab_size)
        return digits

    def block_ids(self, record: RequestRecord) -> tuple[int, ...]:
        ids = record.block_hashes
        return ids if self.max_blocks is None else ids[:self.max_blocks]

    def prompt(self, record: RequestRecord) -> list[int]:
        """The token prompt of a trace request (at most ``max_blocks`` blocks)."""
        ids = self.block_ids(record)
        if not ids:
            raise ValueError(f"request {record.request_id} has no block ids to build a prompt from")
        tokens: list[int] = []
        for block_id in ids[:-1]:
            tokens.extend(self.block(block_id))
        return tokens + self.block(ids[-1])[:self._last_block_tokens(record, len(ids))]

    def _last_block_tokens(self, record: RequestRecord, used_blocks: int) -> int:
        size = record.block_size_tokens
        if used_blocks < len(record.block_hashes) or not size:
            return self.block_tokens
        share = (record.prompt_tokens - (len(record.block_hashes) - 1) * size) / size
        return min(max(math.ceil(share * self.block_tokens), 1), self.block_tokens)
