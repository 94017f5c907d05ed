"""A vLLM CPU-tier cache policy that lets a kvtier admission score decide what goes first.

Load it with ``"eviction_policy": "KvtierScoredLRUPolicy", "cache_policy_module_path":
"kvtier.probes.vllm.cache_policy"`` in ``kv_connector_extra_config`` (vLLM 0.33.0's out-of-tree
``CachePolicy`` hook; 0.32 too). It is vLLM's own LRU policy, except that chunks whose score is below
the threshold are evicted first (oldest first), before any chunk that scored well: the
"drop at once" half of admission. With no scorer configured it is exactly LRU.

The scorer is configured once per process with :func:`configure` (vLLM builds policies by
name with only a capacity, so there is no other channel); it sees the block hash (the
schema's uint64) and returns a score, typically the learned model's reuse probability.
Scores are taken when a chunk is inserted, off the eviction path.

The policy subclasses vLLM's LRU policy, so the class is built on first lookup (PEP 562
``__getattr__``, which is how vLLM's factory fetches it); the module itself, and
:func:`configure`, import without vLLM.
"""

from __future__ import annotations

import functools
from typing import Callable

from kvtier.probes.vllm.block_records import key_hash

_SCORER: dict = {"fn": None, "threshold": 0.0}


def configure(scorer: Callable[[int], float] | None, threshold: float = 0.5) -> None:
    """Set (or clear, with ``None``) the process's scorer and its threshold."""
    if scorer is not None and not callable(scorer):
        raise ValueError(f"scorer must be callable or None, got {scorer!r}")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in 0..1, got {threshold!r}")
    _SCORER.update(fn=scorer, threshold=threshold)


def __getattr__(name: str):
    if name == "KvtierScoredLRUPolicy":
        return _scored_lru_policy()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _scored_lru_policy():
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    class KvtierScoredLRUPolicy(LRUCachePolicy):
        """LRU with low-score chunks evicted first. ``low_score_evictions`` counts them."""

        def __init__(self, cache_capacity: int):
            super().__init__(cache_capacity)
            self._low: set = set()
            self.low_score_evictions = 0

        def insert(self, key, chunk, *req_context) -> None:
            # vLLM 0.33 passes the storing request's ReqContext; 0.32 calls insert(key, chunk).
            super().insert(key, chunk, *req_context)
            scorer = _SCORER["fn"]
            if scorer is None:
                return
            try:
                low = scorer(key_hash(key)) < _SCORER["threshold"]
            except Exception:  # a scorer bug must not break the engine: treat as well scored
                low = False
            if low:
                self._low.add(key)

        def remove(self, key) -> None:
            super().remove(key)
            self._low.discard(key)

        def clear(self) -> None:
            super().clear()
            self._low.clear()

        def evict(self, n, protected):
            if n == 0:
                return []
            chosen = sorted((k for k in self._low if k in self._evictable and k not in protected),
                            key=self._ranks.__getitem__)[:n]
            rest = []
            if len(chosen) < n:
                rest = super().evict(n - len(chosen), set(protected) | set(chosen))
                if rest is None:
                    return None  # atomic: nothing changed
            evicted = []
            for key in chosen:
                chunk = self.chunks[key]
                super().remove(key)
                self._low.discard(key)
                evicted.append((key, chunk))
            self.low_score_evictions += len(evicted)
            for key, _ in rest:
                self._low.discard(key)
            return evicted + rest

    return KvtierScoredLRUPolicy
