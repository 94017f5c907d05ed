"""The CPU tier's offers during a replay, with features and Belady-boundary labels.

In the exclusive hierarchy every GPU victim is offered to the CPU tier. With the GPU tier
fixed (LRU at ``gpu_blocks``) the GPU's contents, and so the offers, barely depend on the CPU
tier's policy (only through the prefix a CPU hit extends, whose GPU hits are pinned first):
nearly the same offers reach every CPU policy, which is what lets one replay score them all;
an offer without a score is admitted. The label of an offer is computed, not guessed: replay the CPU tier under Belady's
MIN at the candidate capacity and mark the offer 1 if the block is promoted from the CPU tier
before MIN evicts it (reused before it would have been evicted: the Belady boundary of LRB).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.features import FEATURES
from kvtier.policy.learn.kernels import kernels
from kvtier.policy.sim.compiled import core
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.policies import NEVER, Belady, make_policy
from kvtier.policy.sim.simulator import Simulator, next_use_indices
from kvtier.policy.sim.trace import BlockTrace


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


@dataclass(frozen=True, eq=False)
class OfferScores:
    """A model's score for each CPU offer of one replay, sorted by (``request_index``,
    block): int32 request indices, uint64 blocks (``keys``), float64 ``scores``. Compiled
    replays look scores up in these arrays; Python code reads them as a mapping
    ``(request index, block) -> score``."""

    request_index: np.ndarray
    keys: np.ndarray
    scores: np.ndarray

    @classmethod
    def of(cls, request_index, keys, scores) -> OfferScores:
        """Scores given in any order (the last one wins for a repeated offer)."""
        order = np.lexsort((keys, request_index))  # stable: repeats stay in their order
        requests = np.asarray(request_index, dtype=np.int32)[order]
        blocks = np.asarray(keys, dtype=np.uint64)[order]
        last = np.ones(len(order), dtype=bool)
        last[:-1] = (requests[1:] != requests[:-1]) | (blocks[1:] != blocks[:-1])
        return cls(requests[last], blocks[last], np.asarray(scores, dtype=np.float64)[order][last])

    def __len__(self) -> int:
        return len(self.scores)

    def _mapping(self) -> dict:
        if not hasattr(self, "_dict"):
            object.__setattr__(self, "_dict", {
                (int(i), int(k)): float(s)
                for i, k, s in zip(self.request_index, self.keys, self.scores)})
        return self._dict

    def __iter__(self):
        return iter(self._mapping())

    def __getitem__(self, key: tuple[int, int]) -> float:
        return self._mapping()[key]

    def get(self, key: tuple[int, int], default=None):
        return self._mapping().get(key, default)

    def table(self, threshold: float = 0.0, chained: bool = False):
        """The core's ``ScoreTable`` over these arrays (no copy)."""
        return core().ScoreTable(self.request_index, self.keys, self.scores, threshold, chained)


def collect_offers(records: Sequence[RequestRecord], gpu_blocks: int | None,
                   cpu_blocks: int | None, *, label: bool = True,
                   trace: BlockTrace | None = None, max_rows: int | None = None) -> Offers:
    """Replay ``records`` (GPU LRU, exclusive tiers) and return every CPU offer. With
    ``label`` the CPU tier runs Belady's MIN at ``cpu_blocks`` and each offer is labelled;
    without, the CPU tier is LRU and labels are 0 (features only, e.g. for scoring).
    ``trace``: the records' arrays, when the caller has them. ``max_rows``: keep every k-th
    offer only, k the smallest that keeps at most that many of a replay as long as the trace
    (a large trace has tens of millions of offers). Runs compiled: the offer log and the
    feature tracker are the kernels' (same rows as :class:`FeatureTracker`)."""
    trace = trace if trace is not None else BlockTrace.from_records(records,
                                                                    _block_tokens(records))
    stride = 1 if max_rows is None else max(1, -(-trace.block_refs // max_rows))
    k = kernels()
    log = k.OfferLog(k.FeatureTracker(), stride=stride)
    _replay(records, trace, gpu_blocks, cpu_blocks, label, log)
    X, y, request_index, keys = log.arrays()
    return Offers(X.reshape(-1, len(FEATURES)), y, request_index, keys)


def score_offers_streamed(records: Sequence[RequestRecord], gpu_blocks: int | None,
                          cpu_blocks: int | None, predict, *, trace: BlockTrace | None = None,
                          chunk_rows: int = 1 << 18) -> OfferScores:
    """``predict(X)`` of every CPU offer of an unlabelled replay (CPU LRU), the rows scored
    a chunk at a time and never all held."""
    trace = trace if trace is not None else BlockTrace.from_records(records,
                                                                    _block_tokens(records))
    parts: tuple[list, list, list] = ([], [], [])

    def score(X, requests, hashes) -> None:
        parts[0].append(requests.astype(np.int32))
        parts[1].append(hashes)
        parts[2].append(np.asarray(predict(X), dtype=np.float64))

    k = kernels()
    log = k.OfferLog(k.FeatureTracker(), on_chunk=score, chunk_rows=chunk_rows)
    _replay(records, trace, gpu_blocks, cpu_blocks, False, log)
    log.flush()
    columns = []
    for dtype, chunks in zip((np.int32, np.uint64, np.float64), parts):
        columns.append(np.concatenate(chunks) if chunks else np.zeros(0, dtype))
        chunks.clear()  # one column's chunks held twice at a time, no more
    kept = core().sort_scores(*columns)  # in offer order already: sorted within each request
    return OfferScores(*(column[:kept] for column in columns))


def _replay(records, trace: BlockTrace, gpu_blocks, cpu_blocks, label: bool, log) -> None:
    config = SimConfig(gpu_blocks=gpu_blocks, cpu_blocks=cpu_blocks, policy="lru",
                       default_block_tokens=_block_tokens(records))
    cpu = Belady(cpu_blocks) if label else make_policy("lru", cpu_blocks)
    Simulator(config, cpu_tier=cpu, offers=log).replay_trace(trace)


def _futures(records: Sequence[RequestRecord]) -> Iterable[list[float]]:
    nexts = iter(next_use_indices(records))
    for record in records:
        yield [next(nexts, NEVER) for _ in record.block_hashes]


def _block_tokens(records: Sequence[RequestRecord]) -> int:
    return next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
