"""A small synthetic trace with learnable reuse: multi-turn conversations that re-send their
history (reused) mixed with one-shot prompts behind a shared system prompt (never reused)."""

from __future__ import annotations

import numpy as np

from kvtier.collector.events import RequestRecord

SYSTEM = (0, 1)


def conversations(requests: int = 1200, seed: int = 0, *, one_shot_share: float = 0.6,
                  block_tokens: int = 16, gap_s: float = 1.0) -> list[RequestRecord]:
    """``requests`` records in arrival order; ids are prefix-chained (a new id per new block)."""
    rng = np.random.default_rng(seed)
    next_id = [100]
    live: list[list[int]] = []

    def fresh(k: int) -> list[int]:
        ids = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return ids

    out = []
    for i in range(requests):
        if live and rng.random() > one_shot_share:
            j = int(rng.integers(len(live)))
            blocks = live[j] + fresh(int(rng.integers(1, 4)))
            live[j] = blocks
            if len(blocks) > 40 or rng.random() < 0.1:
                live.pop(j)
        elif rng.random() < 0.3:
            blocks = list(SYSTEM) + fresh(int(rng.integers(2, 5)))
            live.append(blocks)
        else:
            blocks = list(SYSTEM) + fresh(int(rng.integers(4, 12)))
        out.append(RequestRecord(request_id=f"r{i}", arrival_s=i * gap_s,
                                 prompt_tokens=len(blocks) * block_tokens,
                                 block_hashes=tuple(blocks), block_size_tokens=block_tokens))
    return out


def record(i: int, blocks, t: float | None = None, tokens: int = 16, **extra) -> RequestRecord:
    return RequestRecord(request_id=f"r{i}", arrival_s=float(i if t is None else t),
                         prompt_tokens=len(blocks) * tokens, block_hashes=tuple(blocks),
                         block_size_tokens=tokens, **extra)
