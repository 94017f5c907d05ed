"""The tiered KV cache manager: lookup, allocation with promotions, block caching, release.

Per request, in order: :meth:`lookup` finds the longest prefix of full prompt blocks some tier
holds (the prompt's last token is always computed, as in vLLM, so its logits exist);
:meth:`can_allocate` says whether the GPU pool can hold the whole sequence;
:meth:`allocate` references GPU hits, promotes CPU hits (CPU -> GPU copy) and cold hits
(file -> CPU -> GPU), and takes slots for the rest, evicting (and demoting) victims;
:meth:`cache_full_blocks` registers blocks as they fill; :meth:`free` releases the slots.
"""

from __future__ import annotations

import time
from typing import Callable

from kvtier.collector.events import Outcome, Tier
from kvtier.refengine.config import EngineConfig
from kvtier.refengine.cpu_tier import CpuTier
from kvtier.refengine.device import synchronize
from kvtier.refengine.file_tier import FileTier
from kvtier.refengine.gpu_pool import GpuPool
from kvtier.refengine.hashing import block_hash, chain_hashes
from kvtier.refengine.kv_events import KvEventBuffer
from kvtier.refengine.offload import TierCascade
from kvtier.refengine.sequence import Sequence
from kvtier.refengine.transfer_stats import TransferStats

_MAX_TRACKED_USES = 1 << 20


class KvCacheManager:
    def __init__(self, config: EngineConfig, device, dtype, recorder, events: KvEventBuffer, *,
                 stats: TransferStats | None = None, timer: Callable[[], float] = time.perf_counter):
        tiers = config.tiers
        self.stats = stats or TransferStats()
        self.config, self.device, self._recorder, self._events = config, device, recorder, events
        self._bs, self._timer = config.block_size_tokens, timer
        self._meta: dict[int, tuple[int | None, list[int]]] = {}
        self._uses: dict[int, int] = {}
        self.gpu = GpuPool(tiers.gpu_blocks, config.block_shape, dtype, device, tiers.eviction_policy)
        self.cpu = CpuTier(tiers.cpu_blocks, config.block_shape, dtype, tiers.eviction_policy) \
            if tiers.cpu_blocks else None
        self.cascade = TierCascade(
            self.cpu, None, recorder=recorder, events=events, block_size=self._bs,
            block_bytes=config.block_bytes, admission_threshold=tiers.admission_threshold,
            meta=self._meta.__getitem__, sync=lambda: synchronize(device), timer=timer, stats=self.stats)
        self.file = FileTier(config.file_dir, tiers.cold_blocks, config.block_shape, dtype,
                             tiers.eviction_policy, config.file_io_threads,
                             on_stored=self.cascade.file_stored) if tiers.cold_blocks else None
        self.cascade.file = self.file

    # ---- lookup and feasibility
    def lookup(self, seq: Sequence) -> list[Tier]:
        """Where each block of the longest cached prompt prefix lives (GPU first, then CPU, cold)."""
        if not seq.block_hashes:
            seq.block_hashes = chain_hashes(seq.prompt, self._bs)
        found: list[Tier] = []
        for h in seq.block_hashes[:(seq.prompt_len - 1) // self._bs]:
            tier = self._tier_of(h)
            if tier is None:
                break
            found.append(tier)
        return found

    def _tier_of(self, h: int) -> Tier | None:
        if self.gpu.slot_of(h) is not None:
            return Tier.GPU
        if self.cpu is not None and h in self.cpu:
            return Tier.CPU
        if self.file is not None and h in self.file:
            return Tier.COLD
        return None

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self.lookup(seq)
        on_gpu = {h for h, t in zip(seq.block_hashes, hits) if t is Tier.GPU}
        return self.gpu.available(keeping=on_gpu) >= seq.blocks_needed(self._bs) - len(on_gpu)

    # ---- allocation
    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` a block table: hits first (promoting lower-tier hits), then fresh slots."""
        hits = self.lookup(seq)
        protected = set(seq.block_hashes[:len(hits)])
        self._prune_meta()
        for i, h in enumerate(seq.block_hashes):
            self._meta.setdefault(h, (seq.block_hashes[i - 1] if i else None,
                                      seq.prompt[i * self._bs:(i + 1) * self._bs]))
        table: list[int | None] = [None] * len(hits)
        for position, (h, tier) in enumerate(zip(seq.block_hashes, hits)):
            if tier is Tier.GPU:  # reference every GPU hit before any promotion can evict it
                table[position] = self.gpu.ref(h)
                self._lookup_event(seq, Outcome.GPU_HIT, h, position, None, None)
        cold = [h for h, t in zip(seq.block_hashes, hits) if t is Tier.COLD]
        staged = self._stage_cold(cold, protected) if cold else {}
        for position, (h, tier) in enumerate(zip(seq.block_hashes, hits)):
            self._count_use(h)
            if tier is not Tier.GPU:
                table[position] = self._promote(seq, h, position, tier, staged.get(h, 0.0), protected)
        seq.block_table = table + [self._take_slot(protected)
                                   for _ in range(seq.blocks_needed(self._bs) - len(hits))]
        seq.num_computed = seq.cached_tokens = len(hits) * self._bs
        seq.blocks_registered = len(hits)
        seq.served.gpu = hits.count(Tier.GPU) * self._bs
        seq.served.cpu = hits.count(Tier.CPU) * self._bs
        seq.served.cold = hits.count(Tier.COLD) * self._bs

    def _stage_cold(self, cold: list[int], protected: set[int]) -> dict[int, float]:
        """Read cold hits in parallel and store them in the CPU tier; per-block latency."""
        start = self._timer()
        blocks = self.file.read_many(cold)
        spent_reading = self._timer() - start
        self.stats.add("tier_read", len(cold) * self.config.block_bytes, spent_reading)
        share = spent_reading / len(cold)
        latency = {}
        for h, block in zip(cold, blocks):
            start = self._timer()
            if self.cpu.is_full and not self.cascade.make_room_cpu(protected):
                raise RuntimeError("CPU tier too small to stage this request's cold hits")
            self.cpu.put(h, block)
            spent = self._timer() - start
            self.cascade.store(h, Tier.CPU, Tier.COLD, share + spent)
            latency[h] = share + spent
        return latency

    def _promote(self, seq, h, position, tier, staged_s, protected) -> int:
        slot = self._take_slot(protected)
        start = self._timer()
        self.gpu.data[slot].copy_(self.cpu.get(h), non_blocking=True)
        synchronize(self.device)
        copied_s = self._timer() - start
        self.stats.add("load", self.config.block_bytes, copied_s)
        latency = staged_s + copied_s
        self.gpu.cache(slot, h)
        outcome = Outcome.CPU_PROMOTION if tier is Tier.CPU else Outcome.COLD_PROMOTION
        self._lookup_event(seq, outcome, h, position, tier, latency)
        self.cascade.store(h, Tier.GPU, None, None)
        return slot

    def _take_slot(self, protected: set[int]) -> int:
        slot = self.gpu.take_free()
        if slot is not None:
            return slot
        victim = self.gpu.victim()
        if victim is None:
            raise RuntimeError("GPU pool exhausted: can_allocate must be checked first")
        self.cascade.demote_from_gpu(victim, self.gpu.data[self.gpu.slot_of(victim)],
                                     self._uses.get(victim, 0), protected)
        slot = self.gpu.evict(victim)
        self.cascade.evicted(victim, Tier.GPU)
        self._forget_if_gone(victim)
        return slot

    def _lookup_event(self, seq, outcome, h, position, tier_from, latency_s, tokens=None) -> None:
        parent = seq.block_hashes[position - 1] if position else None  # always a full block
        self._recorder.record(outcome, h, request_id=seq.request_id, parent_hash=parent,
                              position=position, tokens=tokens or self._bs,
                              size_bytes=self.config.block_bytes, tier_from=tier_from,
                              tier_to=Tier.GPU, latency_s=latency_s)

    def _count_use(self, h: int) -> None:
        if len(self._uses) > _MAX_TRACKED_USES:
            self._uses.clear()
        self._uses[h] = self._uses.get(h, 0) + 1

    def _prune_meta(self) -> None:
        """Drop event metadata of blocks no tier holds any more (lower tiers evict silently)."""
        tiers = self.config.tiers
        if len(self._meta) > 2 * (tiers.gpu_blocks + tiers.cpu_blocks + tiers.cold_blocks) + 1024:
            for h in list(self._meta):
                self._forget_if_gone(h)

    def _forget_if_gone(self, h: int) -> None:
        if self._tier_of(h) is None:
            self._meta.pop(h, None)

    # ---- after compute
    def record_recompute(self, seq: Sequence, prefill_s: float) -> None:
        """One ``RECOMPUTE_MISS`` per prompt block not served by a tier (the partial last
        block too), each charged its share of the prefill time."""
        first = seq.cached_tokens // self._bs
        computed = seq.prompt_len - seq.cached_tokens
        ids = chain_hashes(seq.prompt, self._bs, include_partial=True)
        for position in range(first, len(ids)):
            tokens = len(seq.prompt[position * self._bs:(position + 1) * self._bs])
            self._lookup_event(seq, Outcome.RECOMPUTE_MISS, ids[position], position, None,
                               prefill_s * tokens / computed, tokens=tokens)
            if tokens == self._bs:
                self._count_use(ids[position])

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register every block that filled since the last call under its chained hash."""
        tokens = seq.tokens
        while (seq.blocks_registered + 1) * self._bs <= seq.num_computed:
            i = seq.blocks_registered
            if i >= len(seq.block_hashes):
                parent = seq.block_hashes[i - 1] if i else None
                seq.block_hashes.append(block_hash(parent, tokens[i * self._bs:(i + 1) * self._bs]))
            h = seq.block_hashes[i]
            self._meta.setdefault(h, (seq.block_hashes[i - 1] if i else None,
                                      tokens[i * self._bs:(i + 1) * self._bs]))
            if self.gpu.cache(seq.block_table[i], h):
                self.cascade.store(h, Tier.GPU, None, None)
            seq.blocks_registered += 1

    def free(self, seq: Sequence) -> None:
        for slot in seq.block_table:
            self.gpu.release(slot)
        seq.block_table = []

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    # ---- tensors of one sequence
    def gather(self, seq: Sequence, length: int):
        """K and V of positions ``0..length-1``: two tensors [layers, length, heads, head_dim]."""
        blocks = -(-length // self._bs)
        data = self.gpu.data[seq.block_table[:blocks]]  # [blocks, L, 2, bs, H, D]
        layers, _, _, heads, dim = self.config.block_shape
        kv = data.permute(1, 2, 0, 3, 4, 5).reshape(layers, 2, blocks * self._bs, heads, dim)
        return kv[:, 0, :length], kv[:, 1, :length]

    def gather_batch(self, seqs: list[Sequence]):
        """K and V of every sequence's computed positions, zero-padded to the longest:
        two tensors [layers, B, P, heads, head_dim]."""
        import torch

        longest = max(seq.num_computed for seq in seqs)
        layers, _, _, heads, dim = self.config.block_shape
        shape = (layers, len(seqs), longest, heads, dim)
        past_k = torch.zeros(shape, dtype=self.gpu.data.dtype, device=self.device)
        past_v = torch.zeros_like(past_k)
        for i, seq in enumerate(seqs):
            k, v = self.gather(seq, seq.num_computed)
            past_k[:, i, :seq.num_computed] = k
            past_v[:, i, :seq.num_computed] = v
        return past_k, past_v

    def write(self, seq: Sequence, start: int, new_k, new_v) -> None:
        """Store K/V ([layers, n, heads, head_dim]) of positions ``start..`` into the seq's blocks."""
        end = start + new_k.shape[1]
        position = start
        while position < end:
            slot = seq.block_table[position // self._bs]
            offset = position % self._bs
            count = min(self._bs - offset, end - position)
            window = slice(position - start, position - start + count)
            self.gpu.data[slot, :, 0, offset:offset + count] = new_k[:, window]
            self.gpu.data[slot, :, 1, offset:offset + count] = new_v[:, window]
            position += count

    def flush(self) -> None:
        """Wait for pending file writes (their store events then join the next step)."""
        if self.file is not None:
            self.file.flush()

    def resident(self) -> dict[Tier, list[int]]:
        """Block hashes per tier (GPU: cached blocks only)."""
        out = {Tier.GPU: self.gpu.cached_hashes}
        if self.cpu is not None:
            out[Tier.CPU] = self.cpu.hashes
        if self.file is not None:
            out[Tier.COLD] = self.file.hashes
        return out
