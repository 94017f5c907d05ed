"""The tiered what-if simulator: request records in, outcomes and totals out. Pure.

For each request, in arrival order: look up the prompt's blocks in GPU, then CPU, then cold,
stopping at the first block no tier holds (prefix-contiguous reuse: a block after a gap must
be recomputed even if some tier holds it); each leading block's outcome is a GPU hit, a CPU
promotion or a cold promotion, and every later block is a recompute miss. Then the flow
serves the request: promoted and recomputed blocks land on the GPU and move between tiers
per the configured semantics. Requests take zero service time (a cache-content replay; the
cost model turns outcomes into latency).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

from kvtier.collector.events import BlockEvent, Outcome, RequestRecord, Tier
from kvtier.policy.sim.config import SimConfig
from tests.policy.sim.oracle.flows import build_flow
from tests.policy.sim.oracle import NEVER, BlockInfo
from tests.policy.sim.oracle.admission import Admitter
from kvtier.policy.sim.policies.base import DEFAULT_INFO
from kvtier.policy.sim.result import SimResult

_OUTCOME_OF_TIER = {Tier.GPU: Outcome.GPU_HIT, Tier.CPU: Outcome.CPU_PROMOTION,
                    Tier.COLD: Outcome.COLD_PROMOTION}


@dataclasses.dataclass(frozen=True)
class RequestOutcome:
    """One request's lookup outcome per block, and prompt tokens per outcome."""

    outcomes: tuple[Outcome, ...]
    gpu_hit_tokens: int
    cpu_promotion_tokens: int
    cold_promotion_tokens: int
    recompute_tokens: int

    def apply_to(self, record: RequestRecord, tier_config_id: str | None = None) -> RequestRecord:
        """The record with its per-tier token counts filled in, as a live probe would write."""
        return dataclasses.replace(
            record, gpu_hit_tokens=self.gpu_hit_tokens,
            cpu_promotion_tokens=self.cpu_promotion_tokens,
            cold_promotion_tokens=self.cold_promotion_tokens,
            recomputed_tokens=self.recompute_tokens,
            tier_config_id=tier_config_id or record.tier_config_id)


class Simulator:
    """Replays records against one tier stack. Not thread-safe; one simulator per replay.

    ``events``, when given, receives a :class:`BlockEvent` per lookup outcome and per store,
    eviction and drop (the same events live traffic writes); leave it out for speed.
    ``cpu_admitter`` replaces the CPU tier's default admission (a learned model plugs in here);
    ``cpu_tier`` (exclusive semantics) replaces the CPU tier whole: a caller's own policy of
    the tier protocol, in its admitter if it has one.
    """

    def __init__(self, config: SimConfig, *, events: Callable[[BlockEvent], None] | None = None,
                 cpu_admitter: Admitter | None = None, cpu_tier=None) -> None:
        self.config = config
        self.result = SimResult()
        self._events = events
        self._now_s = 0.0
        self._request_id: str | None = None
        emit = self._emit_movement if events is not None else None
        kwargs = {"emit": emit} if emit is not None else {}
        self.flow = build_flow(config, self.result, cpu_tier=cpu_tier,
                               cpu_admitter=cpu_admitter, **kwargs)
        self._plain_infos = not self.flow.reads_info  # no tier reads a block's info

    def replay(self, records: Iterable[RequestRecord],
               on_request: Callable[[RequestRecord, RequestOutcome], None] | None = None
               ) -> SimResult:
        """Serve every record in order; returns the totals (also kept in ``self.result``)."""
        next_uses = None
        if self.uses_future:
            records = list(records)
            next_uses = iter(next_use_indices(records))
        for record in records:
            future = None
            if next_uses is not None:
                future = [next(next_uses) for _ in record.block_hashes]
            outcome = self.serve(record, future)
            if on_request is not None:
                on_request(record, outcome)
        return self.result

    @property
    def uses_future(self) -> bool:
        """Whether a tier needs each block's next use (Belady), so replays compute it."""
        return any(getattr(t, "uses_future", False)
                   for t in (self.flow.gpu, self.flow.cpu, self.flow.cold) if t is not None)

    def lookup(self, record: RequestRecord) -> list[Tier]:
        """The tier that would serve each leading block of ``record`` now (changes nothing)."""
        block_tokens = record.block_size_tokens or self.config.default_block_tokens
        hashes = record.block_hashes
        gpu_limit, cacheable = self.flow.limits(record.prompt_tokens, block_tokens, len(hashes))
        return self.flow.lookup(hashes, gpu_limit, cacheable)

    def serve(self, record: RequestRecord, next_uses: Sequence[float] | None = None
              ) -> RequestOutcome:
        """Look up and serve one request; ``next_uses`` feeds offline policies (Belady)."""
        hashes = record.block_hashes
        block_tokens = record.block_size_tokens or self.config.default_block_tokens
        self.flow.sight(hashes)
        gpu_limit, cacheable = self.flow.limits(record.prompt_tokens, block_tokens, len(hashes))
        found = self.flow.lookup(hashes, gpu_limit, cacheable)
        outcome = self._account(record, found, block_tokens)
        if self._plain_infos and next_uses is None:
            infos = [DEFAULT_INFO] * len(hashes)  # recency-only policies read nothing in it
        else:
            rule = self.config.priorities
            future = next_uses if next_uses is not None else (NEVER,) * len(hashes)
            infos = [BlockInfo(rule.priority(i), future[i], i) for i in range(len(hashes))]
        self._now_s, self._request_id = record.arrival_s, record.request_id
        self.flow.serve(hashes, infos, found, cacheable)
        return outcome

    def _account(self, record: RequestRecord, found: list[Tier], block_tokens: int
                 ) -> RequestOutcome:
        prompt = record.prompt_tokens
        n_blocks = len(record.block_hashes)
        tokens = {Tier.GPU: 0, Tier.CPU: 0, Tier.COLD: 0}
        for i, tier in enumerate(found):
            tokens[tier] += _block_tokens(i, block_tokens, prompt)
        recompute = prompt - sum(tokens.values())
        result = self.result
        result.requests += 1
        result.prompt_tokens += prompt
        result.gpu_hit_tokens += tokens[Tier.GPU]
        result.cpu_promotion_tokens += tokens[Tier.CPU]
        result.cold_promotion_tokens += tokens[Tier.COLD]
        result.recompute_tokens += recompute
        result.block_refs += n_blocks
        blocks = {tier: found.count(tier) for tier in tokens}
        result.gpu_hit_blocks += blocks[Tier.GPU]
        result.cpu_promotion_blocks += blocks[Tier.CPU]
        result.cold_promotion_blocks += blocks[Tier.COLD]
        result.recompute_blocks += n_blocks - len(found)
        outcomes = tuple(_OUTCOME_OF_TIER[t] for t in found)
        outcomes += (Outcome.RECOMPUTE_MISS,) * (n_blocks - len(found))
        if self._events is not None:
            self._emit_lookups(record, outcomes, block_tokens)
        return RequestOutcome(outcomes, tokens[Tier.GPU], tokens[Tier.CPU], tokens[Tier.COLD],
                              recompute)

    def _emit_lookups(self, record: RequestRecord, outcomes, block_tokens: int) -> None:
        tier_from = {Outcome.CPU_PROMOTION: Tier.CPU, Outcome.COLD_PROMOTION: Tier.COLD}
        parent = None
        for i, (h, kind) in enumerate(zip(record.block_hashes, outcomes)):
            self._events(BlockEvent(
                time_s=record.arrival_s, kind=kind, block_hash=h, request_id=record.request_id,
                parent_hash=parent, position=i,
                tokens=_block_tokens(i, block_tokens, record.prompt_tokens),
                tier_from=tier_from.get(kind), tier_to=Tier.GPU))
            parent = h

    def _emit_movement(self, kind: Outcome, block_hash: int, tier_from, tier_to) -> None:
        self._events(BlockEvent(time_s=self._now_s, kind=kind, block_hash=block_hash,
                                request_id=self._request_id, tier_from=tier_from,
                                tier_to=tier_to))


def _block_tokens(index: int, block_tokens: int, prompt_tokens: int) -> int:
    return max(0, min(block_tokens, prompt_tokens - index * block_tokens))


def next_use_indices(records: Sequence[RequestRecord]) -> list[float]:
    """For each block reference in replay order, the global index of the same block's next
    reference (:data:`NEVER` if none). The future that Belady's MIN reads."""
    refs = [h for record in records for h in record.block_hashes]
    result: list[float] = [NEVER] * len(refs)
    seen: dict[int, int] = {}
    for index in range(len(refs) - 1, -1, -1):
        h = refs[index]
        result[index] = seen.get(h, NEVER)
        seen[h] = index
    return result


def simulate(records: Iterable[RequestRecord], config: SimConfig) -> SimResult:
    """Replay ``records`` against ``config`` and return the totals."""
    return Simulator(config).replay(records)


def iter_outcomes(records: Iterable[RequestRecord], config: SimConfig
                  ) -> Iterator[tuple[RequestRecord, RequestOutcome]]:
    """Each record with its outcome, lazily (records are replayed as consumed)."""
    simulator = Simulator(config)
    for record in records:
        yield record, simulator.serve(record)
