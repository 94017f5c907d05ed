"""Replays with a chosen CPU-tier policy under a fixed GPU LRU tier, counted on a window.

The GPU tier is LRU in every replay, so the CPU-tier policies are compared on the same
stream of GPU victims (exclusive tiers: a victim is offered to the CPU tier, a CPU victim to
the cold tier). ``belady`` runs MIN in the CPU tier (the offline bound, fed each block's next
use); every other name is a registry policy, optionally behind an admitter.

A replay whose CPU tier and admitter have compiled forms (registry policies, learned
retention, the learned next-use order and its shadowed form, the learned and oracle
admitters) runs on the trace's arrays in one call; a policy
written in Python is driven record by record (``observe`` before each request).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.collector.request_tokens import RequestTokens
from kvtier.policy.learn.offers import _block_tokens, _futures
from kvtier.policy.sim.compiled import core
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.flows import runs_compiled
from kvtier.policy.sim.policies import Admitted, CachePolicy, make_policy
from kvtier.policy.sim.policies.admission import Admitter
from kvtier.policy.sim.result import SimResult
from kvtier.policy.sim.simulator import Simulator
from kvtier.policy.sim.trace import BlockTrace


@dataclass(frozen=True)
class Tiers:
    """Tier sizes in blocks (``cold_blocks`` 0: no cold tier)."""

    gpu_blocks: int
    cpu_blocks: int
    cold_blocks: int = 0

    def __post_init__(self) -> None:
        for name in ("gpu_blocks", "cpu_blocks", "cold_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")


@dataclass(frozen=True)
class Replayed:
    """Totals over the counted window and each counted request's tokens by outcome."""

    result: SimResult
    requests: tuple[RequestRecord, ...]
    outcomes: tuple[RequestTokens, ...]


class IndexedAdmitter:
    """Admits a CPU offer when its precomputed score is >= ``threshold``. Scores are keyed
    by (request index, block hash); the replay sets ``request_index`` before each request.
    An offer without a score is admitted and counted in ``misses`` (LRU's default).

    Chain-aware (``chained``, the default): a block whose parent prefix no tier holds is
    refused whatever its score, because prefix-contiguous lookup stops at the parent, so
    the block could not be served until the parent is recomputed. The replay wires
    ``parents`` (block -> parent block) and ``resident`` (is a block in any tier)."""

    name = "learned"
    reads_info = False  # it reads its scores by (request, block)

    def __init__(self, scores: dict, threshold: float, *, chained: bool = True) -> None:
        self.scores = scores
        self.threshold = threshold
        self.chained = chained
        self.request_index = 0
        self._misses = 0
        self._compiled = []
        self.parents: dict = {}
        self.resident = None

    @property
    def misses(self) -> int:
        """Offers admitted for want of a score (here and in compiled replays)."""
        return self._misses + sum(table.misses for table in self._compiled)

    def compiled_admitter(self, interner):
        """The compiled admitter (scores as arrays sorted by (request, block)), for a
        compiled flow."""
        if hasattr(self.scores, "table"):
            table = self.scores.table(self.threshold, self.chained)
        else:
            table = core().ScoreTable(*score_arrays(self.scores), self.threshold, self.chained)
        self._compiled.append(table)
        return table

    def admit(self, key, info) -> bool:
        if self.chained and self.resident is not None:
            parent = self.parents.get(key)
            if parent is not None and not self.resident(parent):
                return False
        return self.admits(key)

    def admits(self, key) -> bool:
        """The decision for a block whose parent is held (or that has none)."""
        score = self.scores.get((self.request_index, key))
        if score is None:
            self._misses += 1
            return True
        return score >= self.threshold


def score_arrays(scores: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``{(request index, block): score}`` as arrays sorted by (request index, block)."""
    requests = np.fromiter((k[0] for k in scores), dtype=np.int32, count=len(scores))
    blocks = np.fromiter((k[1] for k in scores), dtype=np.uint64, count=len(scores))
    values = np.fromiter(scores.values(), dtype=np.float64, count=len(scores))
    order = np.lexsort((blocks, requests))
    return requests[order], blocks[order], values[order]


def replay(records: Sequence[RequestRecord], tiers: Tiers,
           cpu_policy: str | Callable[[int], CachePolicy], *,
           admitter: Admitter | None = None, count_from: int = 0,
           count_to: int | None = None,
           on_request: Callable[[int], None] | None = None,
           trace: BlockTrace | None = None, gpu_sightings: int = 0) -> Replayed:
    """Replay all ``records``; totals count requests ``count_from`` to ``count_to``.
    ``cpu_policy``: a registry name, or a builder called with the CPU capacity; a policy
    with an ``observe(index, record)`` method sees each request before it is served.
    ``trace``: the records' arrays, when the caller has them (built once per trace).
    ``gpu_sightings``: the GPU tier keeps a fresh block only from its N-th request on
    (:class:`~kvtier.policy.sim.config.SimConfig`)."""
    block_tokens = _block_tokens(records)
    config = SimConfig(gpu_blocks=tiers.gpu_blocks, cpu_blocks=tiers.cpu_blocks,
                       cold_blocks=tiers.cold_blocks, policy="lru",
                       gpu_sightings=gpu_sightings, default_block_tokens=block_tokens)
    cpu, observe = None, None
    if tiers.cpu_blocks:
        cpu = (make_policy(cpu_policy, tiers.cpu_blocks) if isinstance(cpu_policy, str)
               else cpu_policy(tiers.cpu_blocks))
        if not _compiled(cpu):
            observe = getattr(cpu, "observe", None)
        if admitter is not None:
            cpu = Admitted(cpu, admitter)
    simulator = Simulator(config, cpu_tier=cpu)
    end = len(records) if count_to is None else count_to
    if on_request is None and (cpu is None or _compiled(cpu)):
        trace = trace if trace is not None else BlockTrace.from_records(records, block_tokens)
        done = simulator.replay_trace(trace, count_from=count_from, count_to=end,
                                      outcomes=True)
        return Replayed(done.result, tuple(records[count_from:end]),
                        tuple(RequestTokens(*map(int, row)) for row in done.outcomes))
    if isinstance(admitter, IndexedAdmitter) and not _compiled(cpu):
        flow = simulator.flow
        admitter.resident = lambda h: h in flow.gpu or (flow.cpu is not None and h in flow.cpu)
    futures = _futures(records) if simulator.uses_future else None
    start_totals, counted, outcomes = SimResult(), [], []
    for index, record in enumerate(records):
        if index == count_from:
            start_totals = simulator.result
        if isinstance(admitter, IndexedAdmitter):
            admitter.request_index = index
            _note_parents(admitter.parents, record.block_hashes)
        if observe is not None:
            observe(index, record)
        outcome = simulator.serve(record, next(futures) if futures is not None else None)
        if count_from <= index < end:
            counted.append(record)
            outcomes.append(RequestTokens.of(outcome))
        if index + 1 == end:
            break
        if on_request is not None:
            on_request(index)
    return Replayed(simulator.result.minus(start_totals), tuple(counted), tuple(outcomes))


def _compiled(tier) -> bool:
    """Whether a CPU tier (maybe in its admitter) runs compiled, with nothing to observe."""
    return runs_compiled(tier)


def _note_parents(parents: dict, hashes) -> None:
    for parent, child in pairwise(hashes):
        parents[child] = parent
