"""How blocks move between the GPU, CPU and cold tiers (see ``SimConfig`` for the three
semantics). A flow owns the tier caches; the simulator asks it to look up a request's prefix
and then to serve the request, and reads movement totals from the shared ``SimResult``.

One factory per semantics builds a flow with all its tiers (:data:`FLOWS`, :func:`build_flow`);
a caller that brings its own CPU tier or admitter passes it to the factory. A flow keeps each
block's latest :class:`BlockInfo` only when one of its tiers or admitters declares
``reads_info``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtier.collector.events import Outcome, Tier
from kvtier.policy.sim.config import SimConfig
from tests.policy.sim.oracle import (
    LRU,
    Admitted,
    BlockInfo,
    OfferCountAdmitter,
    PriorityAdmitter,
    PriorityLRU,
    make_policy,
)
from tests.policy.sim.oracle.admission import Admitter, SightingAdmitter
from kvtier.policy.sim.policies.base import DEFAULT_INFO
from kvtier.policy.sim.result import SimResult
from tests.policy.sim.oracle.vllm_cpu import VllmCpuTier
from tests.policy.sim.oracle.vllm_gpu import VllmGpuPool, cacheable_blocks, hit_limit

# emit(kind, block_hash, tier_from, tier_to): movement events, a no-op unless events are wanted
Emit = Callable[[Outcome, int, Tier | None, Tier | None], None]


def _no_emit(kind, block_hash, tier_from, tier_to) -> None:
    return None


class Flow:
    """Common lookup: the tier holding each leading block, stopping at the first miss."""

    def __init__(self, result: SimResult, emit: Emit = _no_emit) -> None:
        self.result = result
        self.emit = emit
        self.emitting = emit is not _no_emit
        self.gpu = self.cpu = self.cold = None
        self.reads_info = False  # whether any tier or admitter reads a block's info

    def lookup(self, hashes: Sequence[int], gpu_limit: int | None = None,
               limit: int | None = None) -> list[Tier]:
        """Tiers of the prefix-contiguous hits: ``found[i]`` serves block ``i``. At most
        ``limit`` blocks hit, and the GPU serves only the first ``gpu_limit`` (see
        :meth:`limits`; ``None``: no bound)."""
        found = []
        gpu, lower = self.gpu, self.lower_tier
        for i, h in enumerate(hashes if limit is None else hashes[:limit]):
            tier = Tier.GPU if (gpu_limit is None or i < gpu_limit) and h in gpu else lower(h)
            if tier is None:
                break
            found.append(tier)
        return found

    def lower_tier(self, h: int) -> Tier | None:
        """The tier below the GPU holding ``h``, if any."""
        if self.cpu is not None and h in self.cpu:
            return Tier.CPU
        if self.cold is not None and h in self.cold:
            return Tier.COLD
        return None

    def limits(self, prompt_tokens: int, block_tokens: int, blocks: int) -> tuple[int, int]:
        """Of a prompt's ``blocks``: how many the GPU may serve, and how many may hit or be
        cached at all (every one, here; an engine flow may say fewer)."""
        return blocks, blocks

    def sight(self, hashes: Sequence[int]) -> None:
        """A request references ``hashes`` (before it is served): an admitter that counts
        requests is told."""
        sight = getattr(self.admitter_of_cpu(), "sight", None)
        if sight is not None:
            sight(hashes)

    def admitter_of_cpu(self):
        return getattr(self.cpu, "admitter", None)

    def serve(self, hashes: Sequence[int], infos: Sequence[BlockInfo], found: list[Tier],
              cacheable: int) -> None:
        raise NotImplementedError

    def pin_gpu_hits(self, hashes: Sequence[int], infos: Sequence[BlockInfo],
                     found: list[Tier]) -> None:
        """Touch the GPU hits first, like an engine pinning them before it allocates, so the
        request's own new blocks cannot evict them."""
        for h, info, tier in zip(hashes, infos, found):
            if tier is Tier.GPU:
                self.gpu.touch(h, info)


    def release_tail_first(self, hashes: Sequence[int], infos: Sequence[BlockInfo]) -> None:
        """Touch the request's GPU-resident blocks last block first: TensorRT-LLM evicts only
        leaves of its radix tree (vLLM's pool, :class:`VllmGpuPool`, frees in reverse to the
        same effect). Under LRU the head of a prompt is then the most recent, so a chain is
        evicted from its tail and a later request keeps the longest prefix that fits
        (head-first eviction would strand the whole chain)."""
        gpu = self.gpu
        for h, info in zip(reversed(hashes), reversed(infos)):
            if h in gpu:
                gpu.touch(h, info)


class ExclusiveFlow(Flow):
    """One copy per block: promotions move up, victims move down (TensorRT-LLM, victim caches).

    The CPU tier, if any, gates GPU victims with its admitter (TensorRT-LLM's priority gate,
    a store threshold, a learned score: see :class:`Admitted`); a refused victim is dropped.
    ``tail_first``: release a request's GPU blocks tail first (engine flows).
    ``gpu_filter`` (a :class:`SightingAdmitter`): of the blocks a request computed afresh, the
    GPU keeps only those that pass it once the request is served (their victims stay evicted).
    """

    def __init__(self, result: SimResult, emit: Emit, gpu, cpu=None, cold=None, *,
                 tail_first: bool = False, gpu_filter: SightingAdmitter | None = None) -> None:
        super().__init__(result, emit)
        self.gpu, self.cpu, self.cold = gpu, cpu, cold
        self.tail_first = tail_first
        self.gpu_filter = gpu_filter
        # the last reference of each resident block, for tiers that read it when the block
        # moves down (priority, next use); plain recency policies do not need it
        self.reads_info = any(getattr(t, "reads_info", True) for t in (gpu, cpu, cold)
                              if t is not None)
        self._keep_info = self.reads_info
        self._info: dict[int, BlockInfo] = {}

    def sight(self, hashes) -> None:
        super().sight(hashes)
        if self.gpu_filter is not None:
            self.gpu_filter.sight(hashes)

    def serve(self, hashes, infos, found, cacheable) -> None:
        self.pin_gpu_hits(hashes, infos, found)
        keep_info = self._keep_info
        fresh = []
        for i, (h, info) in enumerate(zip(hashes, infos)):
            if keep_info:
                self._info[h] = info
            if h in self.gpu:
                if i >= len(found):  # resident past the prefix gap: recomputed, still a use
                    self.gpu.touch(h, info)
                continue
            if self.cpu is not None and h in self.cpu:
                self.cpu.remove(h)
            elif self.cold is not None and h in self.cold:
                self.cold.remove(h)
            else:
                fresh.append(h)
            self._into_gpu(h, info)
        if self.tail_first:
            self.release_tail_first(hashes, infos)
        if self.gpu_filter is not None:
            for h in fresh:
                if h in self.gpu and not self.gpu_filter.passes(h):
                    self.gpu.remove(h)
                    self._drop(h)

    def _into_gpu(self, h: int, info: BlockInfo) -> None:
        victims = self.gpu.insert(h, info)
        if victims:
            self.result.gpu_evictions_total += len(victims)
            for victim in victims:
                if self.emitting:
                    self.emit(Outcome.EVICT, victim, Tier.GPU, None)
                self._demote(victim, Tier.CPU)

    def _demote(self, h: int, tier: Tier | None) -> None:
        """Store ``h`` in ``tier``, cascading its victims downward; ``None``: off the stack."""
        cache = self.cpu if tier is Tier.CPU else self.cold if tier is Tier.COLD else None
        if cache is None:
            self._drop(h)
            return
        victims = cache.insert(h, self._info.get(h, DEFAULT_INFO))
        if h not in cache:
            self._drop(h)
            return
        result = self.result
        below = Tier.COLD if tier is Tier.CPU else None
        if below is Tier.COLD:
            result.cpu_stores_total += 1
            result.cpu_evictions_total += len(victims)
        else:
            result.cold_stores_total += 1
            result.cold_evictions_total += len(victims)
        if self.emitting:
            self.emit(Outcome.STORE, h, Tier.GPU if below is Tier.COLD else Tier.CPU, tier)
        for victim in victims:
            if self.emitting:
                self.emit(Outcome.EVICT, victim, tier, None)
            self._demote(victim, below)

    def _drop(self, h: int) -> None:
        self._info.pop(h, None)
        self.result.drops_total += 1
        if self.emitting:
            self.emit(Outcome.DROP, h, None, None)


class VllmFlow(Flow):
    """vLLM's OffloadingConnector: write-through to CPU as blocks fill, file tier behind CPU.

    The GPU tier is :class:`VllmGpuPool` (vLLM's block pool: hits pinned, computed blocks
    written into the free queue's head, a finished request released tail first, at most
    ``(prompt_tokens - 1) // block_tokens`` hit blocks, partial blocks never cached). The
    CPU tier is :class:`VllmCpuTier` (vLLM's manager call for call). ``cpu_admitter``, when
    given, filters the blocks offered to it before vLLM's own store threshold.
    """

    def __init__(self, config: SimConfig, result: SimResult, emit: Emit = _no_emit,
                 cpu_admitter: Admitter | None = None) -> None:
        super().__init__(result, emit)
        self.gpu_filter = (SightingAdmitter(config.gpu_sightings) if config.gpu_sightings
                           else None)
        self.gpu = VllmGpuPool(config.gpu_blocks, self.gpu_filter.passes
                               if self.gpu_filter is not None else None)
        self.cpu = None
        if config.cpu_blocks != 0:
            self.cpu = VllmCpuTier(config.cpu_blocks, config.policy, config.store_threshold)
        self.cold = LRU(config.cold_blocks) if config.cold_blocks != 0 else None
        self.admitter = cpu_admitter
        self.reads_info = getattr(cpu_admitter, "reads_info", True) if cpu_admitter else False

    def limits(self, prompt_tokens: int, block_tokens: int, blocks: int) -> tuple[int, int]:
        return (hit_limit(prompt_tokens, block_tokens, blocks),
                cacheable_blocks(prompt_tokens, block_tokens, blocks))

    def admitter_of_cpu(self):
        return self.admitter

    def sight(self, hashes) -> None:
        super().sight(hashes)
        if self.gpu_filter is not None:
            self.gpu_filter.sight(hashes)

    def lookup(self, hashes: Sequence[int], gpu_limit: int | None = None,
               limit: int | None = None) -> list[Tier]:
        """The GPU prefix hit (at most ``gpu_limit`` blocks: vLLM computes the last token),
        then what the connector finds in the lower tiers after it, up to ``limit`` (it looks
        in the CPU and file tiers only, so a GPU block past a gap is not a hit; a full prompt
        found there is loaded whole and only its last token recomputed)."""
        found: list[Tier] = []
        gpu = self.gpu
        hashes = hashes if limit is None else hashes[:limit]
        for h in hashes if gpu_limit is None else hashes[:gpu_limit]:
            if h not in gpu:
                break
            found.append(Tier.GPU)
        for h in hashes[len(found):]:
            tier = self.lower_tier(h)
            if tier is None:
                break
            found.append(tier)
        return found

    def serve(self, hashes, infos, found, cacheable) -> None:
        """The GPU serves the request; the CPU tier loads its hits and is offered its
        computed blocks, and its GPU hits too when it loaded nothing (vLLM's scheduler then
        offers the prompt from its first block)."""
        cpu = self.cpu
        gpu_hits = found.count(Tier.GPU)  # the GPU hits lead (see lookup)
        loads, computed = [], []
        for i in range(gpu_hits, cacheable):
            h, tier = hashes[i], found[i] if i < len(found) else None
            if tier is Tier.COLD and cpu is not None:
                self._stage_into_cpu(h, i)
            if tier is not None and cpu is not None and h in cpu:
                loads.append((h, i))
            if tier is None:
                computed.append((h, i, infos[i]))
        victims = self.gpu.serve(hashes, gpu_hits, cacheable)
        self.result.gpu_evictions_total += len(victims)
        if self.emitting:
            for victim in victims:
                self.emit(Outcome.EVICT, victim, Tier.GPU, None)
        if cpu is not None:
            if loads:
                cpu.load(loads)
            if len(found) == gpu_hits:  # nothing loaded: the prompt is offered from block 0
                computed = [(hashes[i], i, infos[i]) for i in range(gpu_hits)] + computed
            if computed:
                self._store(computed)
            cpu.finish()

    def _store(self, computed: list) -> None:
        admitter, cpu = self.admitter, self.cpu
        offered = [(h, i) for h, i, info in computed
                   if admitter is None or h in cpu or admitter.admit(h, info)]
        outcome = self.cpu.store(offered)
        stored, victims = outcome if outcome is not None else ([], [])
        refused = [h for h, _ in offered if h not in self.cpu and h not in stored]
        self._count_cpu_writes(stored, victims, refused)
        if self.cold is not None:
            for h in stored:
                if h not in self.cold:  # the file tier skips files that exist
                    self._cold_store(h)

    def _stage_into_cpu(self, h: int, position: int) -> None:
        """A cold hit takes a CPU slot (no store threshold) before loading to the GPU."""
        outcome = self.cpu.store([(h, position)], threshold=False)
        stored, victims = outcome if outcome is not None else ([], [])
        self._count_cpu_writes(stored, victims, [] if stored or h in self.cpu else [h])

    def _count_cpu_writes(self, stored: list, victims: list, refused: list) -> None:
        result = self.result
        result.cpu_stores_total += len(stored)
        result.cpu_evictions_total += len(victims)
        result.drops_total += len(refused)
        if self.emitting:
            for h in victims:
                self.emit(Outcome.EVICT, h, Tier.CPU, None)
            for h in stored:
                self.emit(Outcome.STORE, h, Tier.GPU, Tier.CPU)
            for h in refused:
                self.emit(Outcome.DROP, h, None, None)

    def _cold_store(self, h: int) -> None:
        victims = self.cold.insert(h)
        self.result.cold_stores_total += 1
        self.result.cold_evictions_total += len(victims)
        if self.emitting:
            self.emit(Outcome.STORE, h, Tier.CPU, Tier.COLD)
            for victim in victims:
                self.emit(Outcome.EVICT, victim, Tier.COLD, None)


def _optional(policy: str, capacity: int | None, admitter: Admitter | None):
    if capacity == 0:
        return None
    cache = make_policy(policy, capacity)
    return Admitted(cache, admitter) if admitter is not None else cache


def exclusive_flow(config: SimConfig, result: SimResult, emit: Emit = _no_emit,
                   cpu_tier=None, cpu_admitter: Admitter | None = None) -> ExclusiveFlow:
    """Every tier runs ``config.policy``; GPU victims pass ``cpu_admitter`` (default: the
    store threshold, when >= 2) into the CPU tier. ``cpu_tier`` replaces the CPU tier whole
    (a caller's own policy, already wrapped in its admitter)."""
    admitter = cpu_admitter
    if admitter is None and config.store_threshold >= 2:
        admitter = OfferCountAdmitter(config.store_threshold)
    if cpu_tier is not None and admitter is not None:
        raise ValueError("pass the admitter inside cpu_tier (Admitted(policy, admitter))")
    cpu = cpu_tier if cpu_tier is not None else _optional(config.policy, config.cpu_blocks,
                                                          admitter)
    return ExclusiveFlow(result, emit, make_policy(config.policy, config.gpu_blocks), cpu,
                         _optional(config.policy, config.cold_blocks, None),
                         gpu_filter=(SightingAdmitter(config.gpu_sightings)
                                     if config.gpu_sightings else None))


def trtllm_flow(config: SimConfig, result: SimResult, emit: Emit = _no_emit,
                cpu_tier=None, cpu_admitter: Admitter | None = None) -> ExclusiveFlow:
    """TensorRT-LLM: priority LRU in both tiers, GPU victims gated by priority into host;
    only leaves are evicted, so a request's GPU blocks are released tail first."""
    _no_cpu_tier(config, cpu_tier)
    cpu = None
    if config.cpu_blocks != 0:
        gate = cpu_admitter or PriorityAdmitter(config.offload_min_priority,
                                                config.offload_comparison)
        cpu = Admitted(PriorityLRU(config.cpu_blocks), gate)
    return ExclusiveFlow(result, emit, PriorityLRU(config.gpu_blocks), cpu, tail_first=True)


def vllm_flow(config: SimConfig, result: SimResult, emit: Emit = _no_emit,
              cpu_tier=None, cpu_admitter: Admitter | None = None) -> VllmFlow:
    _no_cpu_tier(config, cpu_tier)
    return VllmFlow(config, result, emit, cpu_admitter)


def _no_cpu_tier(config: SimConfig, cpu_tier) -> None:
    if cpu_tier is not None:
        raise ValueError(f"semantics {config.semantics!r} builds its own CPU tier; "
                         f"cpu_tier works with 'exclusive' only")


FLOWS = {"exclusive": exclusive_flow, "vllm": vllm_flow, "trtllm": trtllm_flow}


def build_flow(config: SimConfig, result: SimResult, emit: Emit = _no_emit, *,
               cpu_tier=None, cpu_admitter: Admitter | None = None) -> Flow:
    """The flow for ``config.semantics``, built whole by its factory."""
    return FLOWS[config.semantics](config, result, emit, cpu_tier, cpu_admitter)
