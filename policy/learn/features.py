"""Per-block features at the moment a tier would admit the block, from the past only.

:class:`FeatureTracker` watches the request stream (``observe`` after each request is served)
and answers ``row(key, now_s)`` for a block offered to a tier now. Nothing in a row looks at
the future: every value comes from requests already observed, so a row computed during a
replay is the row a live admission hook could compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtier.collector.events import FINISH_CLASSES, RequestRecord, finish_class

FEATURES = (
    "reuse_count",             # references of the block so far (the first one included)
    "age_s",                   # seconds since the block was first referenced
    "since_last_use_s",        # seconds since its last reference
    "requests_since_last_use",  # requests served since its last reference
    "prefix_depth",            # position in the prompt at its last reference (0 = first block)
    "depth_fraction",          # that position over the prompt's block count
    "fanout",                  # distinct children seen in the prefix tree
    "tokens",                  # tokens the block holds (the last block may be partial)
    "is_last_block",           # 1 if it was its request's last (leaf) block
    "popularity",              # decayed reference count (half-life HALF_LIFE_S)
    "parent_popularity",       # the parent prefix's decayed reference count
    "parent_reuse_count",      # the parent's references so far (0 for a root block)
    "turn",                    # the last referencing request's turn (0 when unknown)
    "is_subagent",             # 1 if the last referencing request was a sub-agent call
    "session_requests",        # requests seen so far in that request's session (0: unknown)
    "request_blocks",          # blocks in the last referencing request's prompt
    "request_seen_blocks",     # of those, leading blocks seen before it (its shared prefix)
    "request_prefix_refs",     # references of that shared prefix's deepest block: few =
                               # a private conversation continued, many = a shared system prompt
    "request_turn_gap_s",      # seconds since that deepest shared block's previous use (the
                               # gap between turns of a conversation; 0 without a shared prefix
    "blocks_to_end",           # blocks after it in its last referencing prompt (0 = the prompt
                               # ended here: a partial last block is never reused by a next turn,
                               # which re-sends the prompt and extends it)
    "chain_depth",             # inferred conversation turn of that prompt: 0 unless it extends a
                               # previous prompt whole (its shared prefix ends at that prompt's
                               # end), else the previous prompt's chain_depth + 1
    "request_new_blocks",      # blocks that prompt added past its shared prefix
    "finish_class",            # how that request ended (FINISH_CLASSES index: a tool call
                               # comes straight back, an end of turn waits for a person), once
                               # it has; len(FINISH_CLASSES) while it runs
)
RUNNING = len(FINISH_CLASSES)
HALF_LIFE_S = 300.0


@dataclass
class _Block:
    first_s: float
    last_s: float
    last_request: int
    position: int
    depth_fraction: float
    tokens: int
    is_last: bool
    parent: int | None
    refs: int = 0
    fanout: int = 0
    pop: float = 0.0
    pop_s: float = 0.0
    turn: int = 0
    subagent: bool = False
    session_requests: int = 0
    request_blocks: int = 0
    request_seen: int = 0
    request_prefix_refs: int = 0
    request_gap_s: float = 0.0
    to_end: int = 0
    chain_depth: int = 0
    finish_class: int = 0
    finish_s: float = 0.0


class FeatureTracker:
    """Online per-block statistics. ``observe`` each request after serving it, in order."""

    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s!r}")
        self._decay_per_s = math.log(2) / half_life_s
        self._blocks: dict[int, _Block] = {}
        self._sessions: dict[str, int] = {}
        self.requests = 0

    def observe(self, record: RequestRecord, default_block_tokens: int = 16) -> None:
        """Fold one served request into the statistics."""
        now = record.arrival_s
        block_tokens = record.block_size_tokens or default_block_tokens
        session_count = 0
        if record.session_id is not None:
            session_count = self._sessions.get(record.session_id, 0) + 1
            self._sessions[record.session_id] = session_count
        n = len(record.block_hashes)
        seen, prefix_refs, gap_s = self._shared_prefix(record.block_hashes, now)
        depth = self._chain_depth(record.block_hashes, seen)
        ended = FINISH_CLASSES.index(finish_class(record.finish_status, record.stop_reason))
        ended_s = now + (record.e2e_latency_s or 0.0)
        parent = None
        for i, h in enumerate(record.block_hashes):
            tokens = max(0, min(block_tokens, record.prompt_tokens - i * block_tokens))
            block = self._blocks.get(h)
            if block is None:
                block = _Block(now, now, self.requests, i, 0.0, tokens, False, parent)
                self._blocks[h] = block
                if parent is not None:
                    self._blocks[parent].fanout += 1
            block.refs += 1
            block.pop = self._decayed(block, now) + 1.0
            block.pop_s = now
            block.last_s, block.last_request, block.position = now, self.requests, i
            block.depth_fraction, block.tokens, block.is_last = (i + 1) / n, tokens, i == n - 1
            block.turn = record.turn or 0
            block.subagent = record.request_type == "subagent"
            block.session_requests = session_count
            block.request_blocks, block.request_seen = n, seen
            block.request_prefix_refs, block.request_gap_s = prefix_refs, gap_s
            block.to_end, block.chain_depth = n - 1 - i, depth
            block.finish_class, block.finish_s = ended, ended_s
            parent = h
        self.requests += 1

    def row(self, key: int, now_s: float) -> list[float]:
        """The feature values (in :data:`FEATURES` order) of ``key`` offered at ``now_s``.
        ``KeyError`` for a block never observed (a tier is only offered observed blocks)."""
        b = self._blocks[key]
        parent = self._blocks.get(b.parent) if b.parent is not None else None
        return [float(b.refs), now_s - b.first_s, now_s - b.last_s,
                float(self.requests - b.last_request), float(b.position), b.depth_fraction,
                float(b.fanout), float(b.tokens), float(b.is_last), self._decayed(b, now_s),
                self._decayed(parent, now_s) if parent else 0.0,
                float(parent.refs) if parent else 0.0, float(b.turn), float(b.subagent),
                float(b.session_requests), float(b.request_blocks), float(b.request_seen),
                float(b.request_prefix_refs), b.request_gap_s, float(b.to_end),
                float(b.chain_depth), float(b.request_blocks - b.request_seen),
                float(b.finish_class if b.finish_s <= now_s else RUNNING)]

    def _chain_depth(self, hashes, seen: int) -> int:
        """The inferred turn of a prompt whose first ``seen`` blocks were seen before: a
        next turn when the shared prefix reaches the end of the prompt that last used it
        (its last block, or the one before it: a partial last block is re-sent extended)."""
        if seen == 0:
            return 0
        deepest = self._blocks[hashes[seen - 1]]
        return deepest.chain_depth + 1 if deepest.to_end <= 1 else 0

    def _shared_prefix(self, hashes, now_s: float) -> tuple[int, int, float]:
        """Leading blocks seen before, the references of the deepest of them, and the
        seconds since that block's last use."""
        seen, refs, gap_s = 0, 0, 0.0
        for h in hashes:
            block = self._blocks.get(h)
            if block is None:
                break
            seen, refs, gap_s = seen + 1, block.refs, now_s - block.last_s
        return seen, refs, gap_s

    def _decayed(self, block: _Block, now_s: float) -> float:
        return block.pop * math.exp(-self._decay_per_s * max(0.0, now_s - block.pop_s))
