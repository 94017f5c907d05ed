"""The pure-Python reference of ``kvtier.policy.learn.offers.collect_offers``: the CPU tier's offers
of a replay through the oracle simulator, with the Python ``FeatureTracker``'s rows and
Belady-boundary labels. The compiled offer log is compared against it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord, Tier
from kvtier.policy.learn.features import FEATURES, FeatureTracker
from kvtier.policy.learn.offers import Offers
from kvtier.policy.sim.config import SimConfig
from tests.policy.sim.oracle import NEVER, Belady, CachePolicy, make_policy
from tests.policy.sim.oracle.simulator import Simulator, next_use_indices


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


def oracle_replay(records, tiers, cpu_tier, admitter=None):
    """The totals of a replay through the oracle flows, the CPU tier given whole (a Python
    policy of the oracle), fed as ``kvtier.policy.learn.replay`` fed it before it ran compiled."""
    from kvtier.policy.learn.replay import IndexedAdmitter, _note_parents
    from tests.policy.sim.oracle import Admitted

    block_tokens = _block_tokens(records)
    config = SimConfig(gpu_blocks=tiers.gpu_blocks, cpu_blocks=tiers.cpu_blocks,
                       cold_blocks=tiers.cold_blocks, policy="lru",
                       default_block_tokens=block_tokens)
    observe = getattr(cpu_tier, "observe", None)
    tier = Admitted(cpu_tier, admitter) if admitter is not None else cpu_tier
    simulator = Simulator(config, cpu_tier=tier)
    if isinstance(admitter, IndexedAdmitter):
        flow = simulator.flow
        admitter.resident = lambda h: h in flow.gpu or h in flow.cpu
    futures = _futures(records) if getattr(cpu_tier, "uses_future", False) else None
    for index, record in enumerate(records):
        if isinstance(admitter, IndexedAdmitter):
            admitter.request_index = index
            _note_parents(admitter.parents, record.block_hashes)
        if observe is not None:
            observe(index, record)
        simulator.serve(record, next(futures) if futures is not None else None)
    return simulator.result
