"""Replays with a chosen CPU-tier policy under a fixed GPU LRU tier, counted on a window.

The GPU tier is LRU in every replay, so the CPU-tier policies are compared on the same
stream of GPU victims (exclusive tiers: a victim is offered to the CPU tier, a CPU victim to
the cold tier). ``belady`` runs MIN in the CPU tier (the offline bound, fed each block's next
use); every other name is a registry policy, optionally behind an admitter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from collector.events import RequestRecord
from policy.learn.offers import _block_tokens, _futures
from policy.sim.config import SimConfig
from policy.sim.policies import Admitted, CachePolicy, make_policy
from policy.sim.policies.admission import Admitter
from policy.sim.result import SimResult
from policy.sim.simulator import RequestOutcome, Simulator


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
    """Totals over the counted window and each counted request's outcome."""

    result: SimResult
    requests: tuple[RequestRecord, ...]
    outcomes: tuple[RequestOutcome, ...]


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
        self.misses = 0
        self.parents: dict = {}
        self.resident = None

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
            self.misses += 1
            return True
        return score >= self.threshold


def replay(records: Sequence[RequestRecord], tiers: Tiers,
           cpu_policy: str | Callable[[int], CachePolicy], *,
           admitter: Admitter | None = None, count_from: int = 0,
           count_to: int | None = None,
           on_request: Callable[[int], None] | None = None) -> Replayed:
    """Replay all ``records``; totals count requests ``count_from`` to ``count_to``.
    ``cpu_policy``: a registry name, or a builder called with the CPU capacity; a policy
    with an ``observe(index, record)`` method sees each request before it is served."""
    block_tokens = _block_tokens(records)
    config = SimConfig(gpu_blocks=tiers.gpu_blocks, cpu_blocks=tiers.cpu_blocks,
                       cold_blocks=tiers.cold_blocks, policy="lru",
                       default_block_tokens=block_tokens)
    cpu, observe = None, None
    if tiers.cpu_blocks:
        cpu = (make_policy(cpu_policy, tiers.cpu_blocks) if isinstance(cpu_policy, str)
               else cpu_policy(tiers.cpu_blocks))
        observe = getattr(cpu, "observe", None)
        if admitter is not None:
            cpu = Admitted(cpu, admitter)
    simulator = Simulator(config, cpu_tier=cpu)
    if isinstance(admitter, IndexedAdmitter):
        flow = simulator.flow
        admitter.resident = lambda h: h in flow.gpu or (flow.cpu is not None and h in flow.cpu)
    futures = _futures(records) if simulator.uses_future else None
    end = len(records) if count_to is None else count_to
    start_totals, counted, outcomes = SimResult(), [], []
    for index, record in enumerate(records):
        if index == count_from:
            start_totals = dataclasses.replace(simulator.result)
        if isinstance(admitter, IndexedAdmitter):
            admitter.request_index = index
            _note_parents(admitter.parents, record.block_hashes)
        if observe is not None:
            observe(index, record)
        outcome = simulator.serve(record, next(futures) if futures is not None else None)
        if count_from <= index < end:
            counted.append(record)
            outcomes.append(outcome)
        if index + 1 == end:
            break
        if on_request is not None:
            on_request(index)
    return Replayed(_minus(simulator.result, start_totals), tuple(counted), tuple(outcomes))


def _note_parents(parents: dict, hashes) -> None:
    for parent, child in pairwise(hashes):
        parents[child] = parent


def _minus(total: SimResult, before: SimResult) -> SimResult:
    values = {f.name: getattr(total, f.name) - getattr(before, f.name)
              for f in dataclasses.fields(SimResult)}
    return SimResult(**values)
