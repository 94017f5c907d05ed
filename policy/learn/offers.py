"""The CPU tier's offers during a replay, with features and Belady-boundary labels.

In the exclusive hierarchy every GPU victim is offered to the CPU tier. With the GPU tier
fixed (LRU at ``gpu_blocks``) the GPU's contents, and so the offers, do not depend on the CPU
tier's policy: the same offers reach every CPU policy, which is what lets one replay score
them all. The label of an offer is computed, not guessed: replay the CPU tier under Belady's
MIN at the candidate capacity and mark the offer 1 if the block is promoted from the CPU tier
before MIN evicts it (reused before it would have been evicted: the Belady boundary of LRB).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from collector.events import RequestRecord
from policy.learn.features import FEATURES
from policy.sim.compiled import core
from policy.sim.config import SimConfig
from policy.sim.policies import NEVER, Belady, make_policy
from policy.sim.simulator import Simulator, next_use_indices
from policy.sim.trace import BlockTrace


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


def collect_offers(records: Sequence[RequestRecord], gpu_blocks: int | None,
                   cpu_blocks: int | None, *, label: bool = True,
                   trace: BlockTrace | None = None) -> Offers:
    """Replay ``records`` (GPU LRU, exclusive tiers) and return every CPU offer. With
    ``label`` the CPU tier runs Belady's MIN at ``cpu_blocks`` and each offer is labelled;
    without, the CPU tier is LRU and labels are 0 (features only, e.g. for scoring).
    ``trace``: the records' arrays, when the caller has them. Runs compiled: the offer log
    and the feature tracker are the core's (same rows as :class:`FeatureTracker`)."""
    block_tokens = _block_tokens(records)
    config = SimConfig(gpu_blocks=gpu_blocks, cpu_blocks=cpu_blocks, policy="lru",
                       default_block_tokens=block_tokens)
    c = core()
    log = c.OfferLog(c.FeatureTracker())
    cpu = Belady(cpu_blocks) if label else make_policy("lru", cpu_blocks)
    simulator = Simulator(config, cpu_tier=cpu, offers=log)
    trace = trace if trace is not None else BlockTrace.from_records(records, block_tokens)
    simulator.replay_trace(trace)
    X, y, request_index, keys = log.arrays()
    return Offers(X.reshape(-1, len(FEATURES)), y, request_index, keys)


def _futures(records: Sequence[RequestRecord]) -> Iterable[list[float]]:
    nexts = iter(next_use_indices(records))
    for record in records:
        yield [next(nexts, NEVER) for _ in record.block_hashes]


def _block_tokens(records: Sequence[RequestRecord]) -> int:
    return next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
