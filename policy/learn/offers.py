"""The CPU tier's offers during a replay, with features and Belady-boundary labels.

In the exclusive hierarchy every GPU victim is offered to the CPU tier. With the GPU tier
fixed (LRU at ``gpu_blocks``) the GPU's contents, and so the offers, do not depend on the CPU
tier's policy: the same offers reach every CPU policy, which is what lets one replay score
them all. The label of an offer is computed, not guessed: replay the CPU tier under Belady's
MIN at the candidate capacity and mark the offer 1 if the block is promoted from the CPU tier
before MIN evicts it (reused before it would have been evicted: the Belady boundary of LRB).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from collector.events import RequestRecord, Tier
from policy.learn.features import FEATURES, FeatureTracker
from policy.sim.config import SimConfig
from policy.sim.policies import NEVER, Belady, CachePolicy, make_policy
from policy.sim.simulator import Simulator, next_use_indices


@dataclass(frozen=True)
class Offers:
    """One row per CPU offer: ``X`` (rows x :data:`FEATURES`), ``y`` (1: reused from CPU
    before Belady evicted it; all 0 when unlabelled), ``request_index`` of the request
    during which the offer happened, ``keys`` the block hashes."""

    X: np.ndarray
    y: np.ndarray
    request_index: np.ndarray
    keys: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def take(self, mask: np.ndarray) -> Offers:
        return Offers(self.X[mask], self.y[mask], self.request_index[mask], self.keys[mask])


class _Recorder:
    """Wraps the CPU tier's policy: logs each offer's row and resolves its label."""

    def __init__(self, policy: CachePolicy, tracker: FeatureTracker) -> None:
        self.policy = policy
        self.tracker = tracker
        self.capacity_blocks = policy.capacity_blocks
        self.name = policy.name
        self.reads_info = policy.reads_info
        self.uses_future = policy.uses_future
        self.rows: list[list[float]] = []
        self.labels: list[int] = []
        self.where: list[tuple[int, int]] = []
        self._pending: dict = {}  # resident key -> its offer's row number
        self.now_s = 0.0
        self.request_index = 0
        self.cpu_hits: set = set()  # this request's blocks found in the CPU tier

    def __contains__(self, key) -> bool:
        return key in self.policy

    def __len__(self) -> int:
        return len(self.policy)

    def touch(self, key, info) -> None:
        self.policy.touch(key, info)

    def insert(self, key, info) -> list:
        if key not in self.policy:
            self._pending[key] = len(self.rows)
            self.rows.append(self.tracker.row(key, self.now_s))
            self.labels.append(0)
            self.where.append((self.request_index, key))
        victims = self.policy.insert(key, info)
        for victim in victims:
            self._pending.pop(victim, None)
        if key not in self.policy:
            self._pending.pop(key, None)
        return victims

    def remove(self, key) -> None:
        self.policy.remove(key)
        row = self._pending.pop(key, None)
        if row is not None and key in self.cpu_hits:
            self.labels[row] = 1

    def pop_victim(self):
        victim = self.policy.pop_victim()
        self._pending.pop(victim, None)
        return victim


def collect_offers(records: Sequence[RequestRecord], gpu_blocks: int | None,
                   cpu_blocks: int | None, *, label: bool = True,
                   on_request: Callable[[int], None] | None = None) -> Offers:
    """Replay ``records`` (GPU LRU, exclusive tiers) and return every CPU offer. With
    ``label`` the CPU tier runs Belady's MIN at ``cpu_blocks`` and each offer is labelled;
    without, the CPU tier is LRU and labels are 0 (features only, e.g. for scoring)."""
    block_tokens = _block_tokens(records)
    config = SimConfig(gpu_blocks=gpu_blocks, cpu_blocks=cpu_blocks, policy="lru",
                       default_block_tokens=block_tokens)
    tracker = FeatureTracker()
    inner = Belady(cpu_blocks) if label else make_policy("lru", cpu_blocks)
    recorder = _Recorder(inner, tracker)
    simulator = Simulator(config, cpu_tier=recorder)
    futures = _futures(records) if label else None
    for index, record in enumerate(records):
        tracker.observe(record, block_tokens)
        recorder.now_s, recorder.request_index = record.arrival_s, index
        found = simulator.lookup(record)
        recorder.cpu_hits = {h for h, t in zip(record.block_hashes, found) if t is Tier.CPU}
        simulator.serve(record, next(futures) if futures is not None else None)
        if on_request is not None:
            on_request(index)
    return _as_offers(recorder)


def _as_offers(recorder: _Recorder) -> Offers:
    X = np.asarray(recorder.rows, dtype=float).reshape(-1, len(FEATURES))
    where = recorder.where
    return Offers(X, np.asarray(recorder.labels, dtype=np.int8),
                  np.asarray([w[0] for w in where], dtype=np.int64),
                  np.asarray([w[1] for w in where], dtype=np.uint64))


def _futures(records: Sequence[RequestRecord]) -> Iterable[list[float]]:
    nexts = iter(next_use_indices(records))
    for record in records:
        yield [next(nexts, NEVER) for _ in record.block_hashes]


def _block_tokens(records: Sequence[RequestRecord]) -> int:
    return next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
