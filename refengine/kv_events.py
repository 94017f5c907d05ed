"""vLLM-format KV events: the per-step buffer the cache fills and its wire encoding.

Encoding follows vLLM 0.33.0 (``vllm/distributed/kv_events.py``): a batch is the msgpack
array ``[ts, events, dp_rank]``; each event is a map whose first key is ``"type"``;
``medium`` is ``"GPU"``, ``"CPU"`` or ``"STORAGE"``; hashes are uint64 ints. Fields without
defaults are always present (``parent_block_hash``, ``lora_id``, ``medium``, ``lora_name``).
"""

from __future__ import annotations

import threading

from kvtier.collector.events import Tier

MEDIUM = {Tier.GPU: "GPU", Tier.CPU: "CPU", Tier.COLD: "STORAGE"}


def block_stored(block_hash: int, parent_hash: int | None, token_ids: list[int],
                 block_size: int, tier: Tier) -> dict:
    return {"type": "BlockStored", "block_hashes": [block_hash], "parent_block_hash": parent_hash,
            "token_ids": list(token_ids), "block_size": block_size, "lora_id": None,
            "medium": MEDIUM[tier], "lora_name": None, "group_idx": 0}


def block_removed(block_hash: int, tier: Tier) -> dict:
    return {"type": "BlockRemoved", "block_hashes": [block_hash], "medium": MEDIUM[tier],
            "group_idx": 0}


def encode_batch(ts_s: float, events: list[dict], dp_rank: int = 0) -> bytes:
    import msgpack

    return msgpack.packb([ts_s, events, dp_rank], use_bin_type=True)


class KvEventBuffer:
    """Events of the current engine step. Appended from the engine thread and the file
    tier's writer threads; :meth:`take` drains them once per step."""

    def __init__(self):
        self._lock = threading.Lock()
        self._events: list[dict] = []

    def append(self, event: dict) -> None:
        with self._lock:
            self._events.append(event)

    def take(self) -> list[dict]:
        with self._lock:
            events, self._events = self._events, []
        return events
