"""Learned retention: the CPU tier evicts by the model's score decayed with time since use.

The admission model's score ``p`` (P(reused before the tier would evict it), one per offer)
also orders eviction: a block's value is ``p * exp(-(now - last_use) / tau)``, the chance of
reuse fading as the block goes unused. Every block decays at the same rate, so the order is
that of ``ln p + last_use / tau`` and never changes over time: one lazy min-heap keeps it.
``tau`` trades the score against recency (``tau`` -> 0 is LRU, ``tau`` -> inf pure score);
it is chosen on the training period's latest slice (:func:`choose_tau`), like a threshold.

Eviction follows prefix chains: a victim with a descendant in the tier gives way to its
deepest resident descendant (at each step its first-seen resident child), so a chain is
evicted from its tail (a head without its tail still serves the next turn's prefix; a tail
without its head serves nothing). Ties go to the block deeper in its prompt. No block is
refused: the score only orders eviction. Replays run the compiled form of this order
(``compiled_tier``, the kernels' ``Retention``); this class is its per-key face and reference.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.replay import Tiers, replay, score_arrays
from kvtier.policy.learn.kernels import kernels
from kvtier.policy.sim.compiled import core
from kvtier.policy.sim.trace import BlockTrace
from kvtier.policy.sim.policies.base import BlockInfo, CachePolicy, Key

TAUS_S = (10.0, 30.0, 100.0, 300.0, math.inf)
VALIDATION_FRACTION = 0.2
FLOOR = 1e-4  # a score of 0 would outrank every recency


class LearnedRetention(CachePolicy):
    """Evicts the lowest ``ln(score) + last_use_s / tau_s``, tails first. ``scores`` maps
    (request index, block) of an offer to the model's score; the replay calls
    :meth:`observe` with each request before serving it."""

    name = "learned-retention"

    def __init__(self, capacity_blocks: int | None, scores: dict, tau_s: float) -> None:
        super().__init__(capacity_blocks)
        if not tau_s > 0:
            raise ValueError(f"tau_s must be > 0, got {tau_s!r}")
        self.scores = scores
        self.tau_s = tau_s
        self.request_index = -1
        self._last_s: dict = {}     # block -> time of its last reference
        self._position: dict = {}   # block -> its position in the prompt
        self._children: dict = {}   # block -> blocks seen right after it, first seen first
        self._key: dict = {}        # resident block -> its heap key
        self._heap: list = []

    def compiled_tier(self, interner):
        """The compiled tier of this order, for a compiled flow (which feeds it each request
        itself; only a fresh policy can be compiled)."""
        if self._key or self._last_s:
            raise ValueError("a learned-retention tier that has seen blocks cannot join a flow")
        c = core()
        scores = (self.scores.table() if hasattr(self.scores, "table")
                  else c.ScoreTable(*score_arrays(self.scores), 0.0, False))
        k = kernels()
        return k.Retention(self.capacity_blocks, scores, self.tau_s, k.RetentionTracker())

    def observe(self, index: int, record: RequestRecord) -> None:
        """Note a request before it is served: its blocks' last use, positions, children."""
        self.request_index = index
        now, hashes = record.arrival_s, record.block_hashes
        for i, h in enumerate(hashes):
            self._last_s[h] = now
            self._position[h] = i
            if i:
                self._children.setdefault(hashes[i - 1], {})[h] = None

    def _store(self, key: Key, info: BlockInfo) -> None:
        p = self.scores.get((self.request_index, key), 0.5)
        decay = self._last_s.get(key, 0.0) / self.tau_s if math.isfinite(self.tau_s) else 0.0
        value = math.log(max(p, FLOOR)) + decay
        self._key[key] = value
        heapq.heappush(self._heap, (value, -self._position.get(key, 0), key))
        if len(self._heap) > 4 * len(self._key) + 1024:  # drop stale entries now and then
            self._heap = [e for e in self._heap if self._key.get(e[2]) == e[0]]
            heapq.heapify(self._heap)

    def _hit(self, key: Key, info: BlockInfo) -> None:
        return None  # exclusive tiers: a hit leaves the tier (promotion), nothing to reorder

    def _evict(self) -> Key:
        heap, keys = self._heap, self._key
        while keys.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        victim = heap[0][2]
        while True:  # its deepest resident descendant goes first
            child = next((c for c in self._children.get(victim, ()) if c in keys), None)
            if child is None:
                break
            victim = child
        del keys[victim]
        return victim

    def _forget(self, key: Key) -> None:
        del self._key[key]


def factory(scores: dict, tau_s: float):
    """A ``capacity -> LearnedRetention`` builder for :func:`kvtier.policy.learn.replay.replay`."""
    return lambda capacity: LearnedRetention(capacity, scores, tau_s)


def choose_tau(train: Sequence[RequestRecord], tiers: Tiers, scores: dict,
               taus: Sequence[float] = TAUS_S, *, trace: BlockTrace | None = None
               ) -> tuple[float, tuple[tuple[float, float], ...]]:
    """The ``tau`` with the best token hit ratio on the training period's latest slice
    (ties: the larger), and the sweep as (tau, hit ratio) pairs. ``trace``: the training
    records' blocks as arrays, when the caller has them."""
    count_from = int(len(train) * (1 - VALIDATION_FRACTION))
    trace = trace if trace is not None else BlockTrace.from_records(train)
    sweep = tuple((tau, replay(train, tiers, factory(scores, tau), count_from=count_from,
                               trace=trace).result.token_hit_ratio) for tau in taus)
    return max(sweep, key=lambda point: (point[1], point[0]))[0], sweep
