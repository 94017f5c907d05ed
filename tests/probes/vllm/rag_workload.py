"""A RAG-shaped workload for a serving vLLM: long shared prefixes (a system prompt and one of a
few retrieved documents, popular ones more often) under short questions, interleaved with
chat sessions whose turns extend their history. A Bailian-format trace (one hash id per
32-token engine block), for ``kvtier probe load``.

With the tests' engine (6 MiB of KV: ~96 blocks) the GPU holds two or three documents at a
time, so the others come back from a CPU tier when there is one, and recompute otherwise.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SYSTEM_BLOCKS, DOC_BLOCKS, QUESTION_BLOCKS, TURN_BLOCKS = 2, 14, 1, 2
DOCS, SESSIONS, CHAT_SHARE = 8, 6, 0.3


def rag_trace(path: Path, requests: int = 320, seed: int = 0) -> Path:
    """``requests`` rows: about :data:`CHAT_SHARE` of them chat turns, the rest questions on a
    document drawn with Zipf-like popularity; session histories stop growing at 24 blocks."""
    rng = random.Random(seed)
    system = list(range(1, SYSTEM_BLOCKS + 1))
    docs = [[10_000 * (d + 1) + k for k in range(DOC_BLOCKS)] for d in range(DOCS)]
    weights = [1.0 / (d + 1) for d in range(DOCS)]
    history = {s: [] for s in range(SESSIONS)}
    turns = {s: 0 for s in range(SESSIONS)}
    rows, fresh = [], 1_000_000
    for i in range(requests):
        if rng.random() < CHAT_SHARE:
            s = rng.randrange(SESSIONS)
            if len(history[s]) >= 24:
                history[s], turns[s] = [], 0
            history[s] += [fresh + k for k in range(TURN_BLOCKS)]
            fresh += TURN_BLOCKS
            turns[s] += 1
            ids = system + history[s]
            chat_id, parent, turn = 100_000 * (s + 1) + turns[s], -1, turns[s]
            if turns[s] > 1:
                parent = chat_id - 1
        else:
            doc = rng.choices(range(DOCS), weights)[0]
            ids = system + docs[doc] + [fresh + k for k in range(QUESTION_BLOCKS)]
            fresh += QUESTION_BLOCKS
            chat_id, parent, turn = 900_000 + i, -1, 1
        rows.append({"chat_id": chat_id, "timestamp": float(i), "parent_chat_id": parent,
                     "input_length": 16 * len(ids), "output_length": 8, "type": "text",
                     "turn": turn, "hash_ids": ids})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
