"""The tiered what-if simulator: request records in, outcomes and totals out. Pure.

For each request, in arrival order: look up the prompt's blocks in GPU, then CPU, then cold,
stopping at the first block no tier holds (prefix-contiguous reuse: a block after a gap must
be recomputed even if some tier holds it); each leading block's outcome is a GPU hit, a CPU
promotion or a cold promotion, and every later block is a recompute miss. Then the flow
serves the request: promoted and recomputed blocks land on the GPU and move between tiers
per the configured semantics. Requests take zero service time (a cache-content replay; the
cost model turns outcomes into latency).

The replay runs in the compiled core (``policy/sim/_core.pyx``); records are turned into
arrays of dense block ids a chunk at a time, and a :class:`kvtier.policy.sim.trace.BlockTrace` is
replayed without a Python object per request (:meth:`Simulator.replay_trace`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from kvtier.collector.events import BlockEvent, Outcome, RequestRecord, Tier
from kvtier.policy.sim.compiled import NEVER_ID, core
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.flows import build_flow
from kvtier.policy.sim.policies import NEVER
from kvtier.policy.sim.policies.admission import Admitter
from kvtier.policy.sim.result import SimResult
from kvtier.policy.sim.trace import BlockTrace

_OUTCOME_OF_TIER = (Outcome.GPU_HIT, Outcome.CPU_PROMOTION, Outcome.COLD_PROMOTION)
_TIER_FROM = {Outcome.CPU_PROMOTION: Tier.CPU, Outcome.COLD_PROMOTION: Tier.COLD}
CHUNK_REQUESTS = 4096  # records turned into arrays at a time


@dataclasses.dataclass(frozen=True)
class RequestOutcome:
    """One request's lookup outcome per block, and prompt tokens per outcome. ``found`` holds
    the tier (``Tier`` value) of each leading block a tier served, one byte each; the other
    blocks of the prompt's ``blocks`` were recomputed."""

    found: bytes
    blocks: int
    gpu_hit_tokens: int
    cpu_promotion_tokens: int
    cold_promotion_tokens: int
    recompute_tokens: int

    @property
    def outcomes(self) -> tuple[Outcome, ...]:
        """The :class:`Outcome` of each block of the prompt, in order."""
        served = tuple(_OUTCOME_OF_TIER[t] for t in self.found)
        return served + (Outcome.RECOMPUTE_MISS,) * (self.blocks - len(served))


@dataclasses.dataclass(frozen=True, eq=False)
class TraceReplay:
    """Totals over a replay's counted window, and per counted request its GPU hit, CPU
    promotion, cold promotion and recompute tokens (``None`` unless asked for)."""

    result: SimResult
    outcomes: np.ndarray | None


class Simulator:
    """Replays records against one tier stack. Not thread-safe; one simulator per replay.

    ``events``, when given, receives a :class:`BlockEvent` per lookup outcome and per store,
    eviction and drop (the same events live traffic writes); leave it out for speed.
    ``cpu_admitter`` replaces the CPU tier's default admission (a learned model plugs in here);
    ``cpu_tier`` (exclusive semantics) replaces the CPU tier whole: a caller's own policy of
    the tier protocol, in its admitter if it has one. ``offers`` (the learned kernels'
    ``OfferLog``, exclusive semantics) records every block offered to the CPU tier.
    """

    def __init__(self, config: SimConfig, *, events: Callable[[BlockEvent], None] | None = None,
                 cpu_admitter: Admitter | None = None, cpu_tier=None, offers=None) -> None:
        self.config = config
        self.flow = build_flow(config, cpu_tier=cpu_tier, cpu_admitter=cpu_admitter,
                               offers=offers)
        self._core = self.flow.compiled
        self._events = events
        if events is not None:
            self._core.log_events(True)

    @property
    def result(self) -> SimResult:
        """The totals so far (a fresh value each time)."""
        return SimResult(**self._core.totals())

    @property
    def uses_future(self) -> bool:
        """Whether a tier needs each block's next use (Belady), so replays compute it."""
        return self._core.uses_future()

    def _block_tokens(self, record: RequestRecord) -> int:
        return record.block_size_tokens or self.config.default_block_tokens

    def _ids(self, hashes) -> np.ndarray:
        return self._core.ids(np.asarray(hashes, dtype=np.uint64))

    def lookup(self, record: RequestRecord) -> list[Tier]:
        """The tier that would serve each leading block of ``record`` now (changes nothing)."""
        found = self._core.peek(self._ids(record.block_hashes), record.prompt_tokens,
                                self._block_tokens(record))
        return [Tier(t) for t in found.tolist()]

    def serve(self, record: RequestRecord, next_uses: Sequence[float] | None = None
              ) -> RequestOutcome:
        """Look up and serve one request; ``next_uses`` feeds offline policies (Belady)."""
        block_tokens = self._block_tokens(record)
        future = None
        if next_uses is not None:
            future = np.array([NEVER_ID if math.isinf(n) else int(n) for n in next_uses],
                              dtype=np.int64)
        one = BlockTrace.from_records((record,), self.config.default_block_tokens)
        self._core.set_requests(one.arrival_s, one.turns, one.subagent, one.sessions,
                                one.finish_classes, one.finish_s)
        found, tokens = self._core.serve_one(self._ids(record.block_hashes),
                                             record.prompt_tokens, block_tokens, future)
        outcome = RequestOutcome(found.tobytes(), len(record.block_hashes), *tokens)
        if self._events is not None:
            self._emit(record, outcome, block_tokens)
        return outcome

    def replay(self, records: Iterable[RequestRecord],
               on_request: Callable[[RequestRecord, RequestOutcome], None] | None = None
               ) -> SimResult:
        """Serve every record in order; returns the totals (also in ``self.result``)."""
        if self._events is not None:
            for record in records:
                outcome = self.serve(record)
                if on_request is not None:
                    on_request(record, outcome)
            return self.result
        if self.uses_future:
            records = list(records)
            self._replay_chunk(records, on_request, future=True)
            return self.result
        chunk: list[RequestRecord] = []
        for record in records:
            chunk.append(record)
            if len(chunk) == CHUNK_REQUESTS:
                self._replay_chunk(chunk, on_request)
                chunk = []
        if chunk:
            self._replay_chunk(chunk, on_request)
        return self.result

    def _replay_chunk(self, records: list[RequestRecord], on_request, *, future=False) -> None:
        trace = BlockTrace.from_records(records, self.config.default_block_tokens)
        ids = self._core.ids(trace.hashes)
        nexts = core().next_uses(ids, len(self._core.interner)) if future else None
        self._core.set_requests(trace.arrival_s, trace.turns, trace.subagent, trace.sessions,
                                trace.finish_classes, trace.finish_s)
        rows = np.zeros((len(records), 5), dtype=np.int64)
        found = np.zeros(len(ids), dtype=np.int8) if on_request is not None else None
        self._core.replay(ids, trace.offsets, trace.prompt_tokens, trace.block_tokens, nexts,
                          outcomes=rows, found=found)
        if on_request is None:
            return
        offsets = trace.offsets
        for i, record in enumerate(records):
            start = offsets[i]
            row = rows[i]
            on_request(record, RequestOutcome(found[start:start + row[4]].tobytes(),
                                              int(offsets[i + 1] - start), int(row[0]),
                                              int(row[1]), int(row[2]), int(row[3])))

    def replay_trace(self, trace: BlockTrace, *, count_from: int = 0,
                     count_to: int | None = None, outcomes: bool = False) -> TraceReplay:
        """Serve the requests of ``trace`` up to ``count_to`` (all by default), after the ones
        served before, without a Python object per request. Totals (and, with ``outcomes``,
        each request's GPU hit, CPU promotion, cold promotion and recompute tokens) count
        requests ``count_from`` to ``count_to``; earlier ones only warm the tiers."""
        end = len(trace) if count_to is None else count_to
        if not 0 <= count_from <= end <= len(trace):
            raise ValueError(f"need 0 <= count_from <= count_to <= {len(trace)}, got "
                             f"{count_from} and {end}")
        ids = self._core.ids(trace.hashes)
        nexts = core().next_uses(ids, len(self._core.interner)) if self.uses_future else None
        self._core.set_requests(trace.arrival_s, trace.turns, trace.subagent, trace.sessions,
                                trace.finish_classes, trace.finish_s)
        rows = np.zeros((len(trace), 5), dtype=np.int64) if outcomes else None
        replay = self._core.replay
        args = (ids, trace.offsets, trace.prompt_tokens, trace.block_tokens, nexts)
        replay(*args, outcomes=rows, start=0, stop=count_from)
        before = self.result
        replay(*args, outcomes=rows, start=count_from, stop=end)
        return TraceReplay(self.result.minus(before),
                           rows[count_from:end, :4] if outcomes else None)

    def _emit(self, record: RequestRecord, outcome: RequestOutcome, block_tokens: int) -> None:
        emit, now, rid = self._events, record.arrival_s, record.request_id
        parent = None
        for i, (h, kind) in enumerate(zip(record.block_hashes, outcome.outcomes)):
            emit(BlockEvent(time_s=now, kind=kind, block_hash=h, request_id=rid,
                            parent_hash=parent, position=i,
                            tokens=_block_tokens(i, block_tokens, record.prompt_tokens),
                            tier_from=_TIER_FROM.get(kind), tier_to=Tier.GPU))
            parent = h
        for kind, h, tier_from, tier_to in zip(*self._core.take_events()):
            emit(BlockEvent(time_s=now, kind=Outcome(int(kind)), block_hash=int(h),
                            request_id=rid,
                            tier_from=Tier(int(tier_from)) if tier_from >= 0 else None,
                            tier_to=Tier(int(tier_to)) if tier_to >= 0 else None))


def _block_tokens(index: int, block_tokens: int, prompt_tokens: int) -> int:
    return max(0, min(block_tokens, prompt_tokens - index * block_tokens))


def next_use_indices(records: Sequence[RequestRecord]) -> list[float]:
    """For each block reference in replay order, the global index of the same block's next
    reference (:data:`NEVER` if none). The future that Belady's MIN reads."""
    trace = BlockTrace.from_records(records)
    interner = core().Interner()
    nexts = core().next_uses(interner.ids(trace.hashes), len(interner))
    return [NEVER if n == NEVER_ID else n for n in nexts.tolist()]


def simulate(records: Iterable[RequestRecord], config: SimConfig) -> SimResult:
    """Replay ``records`` against ``config`` and return the totals."""
    return Simulator(config).replay(records)


def iter_outcomes(records: Iterable[RequestRecord], config: SimConfig
                  ) -> Iterator[tuple[RequestRecord, RequestOutcome]]:
    """Each record with its outcome, lazily (records are replayed as consumed)."""
    simulator = Simulator(config)
    for record in records:
        yield record, simulator.serve(record)
