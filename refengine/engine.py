"""The reference engine: one thread steps the scheduler, the model and the KV cache.

Each :meth:`ReferenceEngine.step` admits waiting requests that fit (allocating blocks and
promoting lower-tier hits), prefills their uncached tokens one request at a time, decodes one
token for every other running request in one batched pass (padded and masked), registers newly
filled blocks, finishes completed requests (one ``RequestRecord`` each) and publishes the
step's KV events. Decoding is greedy. A step that computed records one ``StepRecord``: the
scheduler's :class:`~kvtier.refengine.scheduler.ScheduledWork`, the bytes promoted into and
offloaded out of the GPU tier meanwhile, and the step's measured duration (its start to its
end, on the injected ``timer``; the engine does not preempt, so ``preempted_requests`` is 0).

Thread contract: :meth:`submit` and :meth:`reconfigure` may be called from any thread;
everything else runs on the thread that calls :meth:`step`.
"""

from __future__ import annotations

import queue
import time
from typing import Callable

import torch

from kvtier.collector.events import RequestRecord
from kvtier.refengine.config import EngineConfig, TierConfig
from kvtier.refengine.device import compute_device, torch_dtype
from kvtier.refengine.hashing import chain_hashes
from kvtier.refengine.capacity import check_tiers_fit
from kvtier.refengine.kv_events import KvEventBuffer, encode_batch
from kvtier.refengine.kv_manager import KvCacheManager
from kvtier.refengine.model import TinyDecoder
from kvtier.refengine.scheduler import Scheduler
from kvtier.refengine.sequence import Sequence
from kvtier.refengine.transfer_stats import TransferStats


class ReferenceEngine:
    """``recorder`` receives block events, request records and step records;
    ``publish(payload)`` (e.g. :meth:`KvEventPublisher.publish`) receives one encoded vLLM
    ``KVEventBatch`` per step that had events; ``on_request(record)`` sees each finished
    request (metrics)."""

    def __init__(self, config: EngineConfig, recorder, *,
                 publish: Callable[[bytes], None] | None = None,
                 on_request: Callable[[RequestRecord], None] | None = None,
                 clock: Callable[[], float] = time.time, timer: Callable[[], float] = time.perf_counter):
        self.config = config
        self.device, self.dtype = compute_device(), torch_dtype(config.dtype)
        check_tiers_fit(config.tiers, config.block_bytes, self.device, file_dir=config.file_dir)
        self.model = TinyDecoder(config, self.device, self.dtype)
        self._recorder, self._publish, self._on_request = recorder, publish, on_request
        self._clock, self._timer = clock, timer
        self.events = KvEventBuffer()
        self.transfers = TransferStats()  # survives tier switches, as counters must
        self.kv = KvCacheManager(config, self.device, self.dtype, recorder, self.events,
                                 stats=self.transfers, timer=timer)
        self.scheduler = Scheduler(config.max_batch_size)
        self._incoming: queue.Queue[Sequence] = queue.Queue()
        self._pending_tiers: queue.Queue[TierConfig] = queue.Queue()
        self._aborts: queue.Queue[tuple[Sequence, str]] = queue.Queue()
        self.switch_error: str | None = None  # why the last tier switch was not applied
        self.steps = 0  # steps that computed, numbering the step records

    # ---- any thread
    def submit(self, seq: Sequence) -> None:
        """Queue a request; ``ValueError`` if it can never fit this engine."""
        total = seq.prompt_len + seq.max_tokens
        if total > self.config.max_positions:
            raise ValueError(f"prompt + max_tokens = {total} exceeds max_positions={self.config.max_positions}")
        if any(not 0 <= t < self.config.vocab_size for t in seq.prompt):
            raise ValueError(f"token ids must be in 0..{self.config.vocab_size - 1}")
        if seq.blocks_needed(self.config.block_size_tokens) > self.config.tiers.gpu_blocks:
            raise ValueError(f"request needs {seq.blocks_needed(self.config.block_size_tokens)} blocks; "
                             f"the GPU tier has {self.config.tiers.gpu_blocks}")
        seq.arrival_s = self._clock()
        self._incoming.put(seq)

    def reconfigure(self, tiers: TierConfig) -> None:
        """Switch tier configuration once the running batch drains (the caches start empty)."""
        if not isinstance(tiers, TierConfig):
            raise ValueError(f"tiers must be a TierConfig, got {type(tiers).__name__}")
        self.config.with_tiers(tiers)  # validates against the engine config (file_dir)
        check_tiers_fit(tiers, self.config.block_bytes, self.device, held=self.config.tiers,
                        file_dir=self.config.file_dir)
        self._pending_tiers.put(tiers)

    def abort(self, seq: Sequence, reason: str) -> None:
        """End ``seq`` at the next step (its client went away): it leaves the queue or the
        running batch, its blocks are freed and ``on_finish`` runs with ``error=reason``."""
        self._aborts.put((seq, reason))

    # ---- engine thread
    def step(self) -> bool:
        """One scheduling round; ``False`` if there was nothing to do."""
        started_s, started, moved = self._clock(), self._timer(), self.transfers.snapshot()
        while not self._incoming.empty():
            self.scheduler.add(self._incoming.get_nowait())
        self._apply_aborts()
        self._apply_pending_tiers()
        admitted = self.scheduler.admit(self.kv) if self._pending_tiers.empty() else []
        work = self.scheduler.work(admitted)
        for seq in admitted:
            seq.tier_config_id = self.config.tiers.config_id
            self._prefill(seq)
        decoding = [s for s in self.scheduler.running if s not in admitted]
        if decoding:
            self._decode(decoding)
        for seq in [s for s in self.scheduler.running if s.is_done]:
            self._finish(seq)
        if work.computes:
            self._record_step(work, started_s, started, moved)
        events = self.events.take()
        if events and self._publish is not None:
            self._publish(encode_batch(self._clock(), events))
        return bool(admitted or self.scheduler.running or events)

    def _record_step(self, work, started_s: float, started: float, moved: dict) -> None:
        now = self.transfers.snapshot()
        self._recorder.record_step(
            started_s, self.steps, self._timer() - started, work.prefill_tokens,
            work.prefill_requests, work.prefill_context_tokens, work.cached_tokens,
            work.decode_requests, work.decode_context_tokens, work.running_requests,
            work.waiting_requests, 0, now["load"][0] - moved["load"][0],
            now["store"][0] - moved["store"][0])
        self.steps += 1

    def _prefill(self, seq: Sequence) -> None:
        start = self._timer()
        self._forward(seq, seq.prompt[seq.num_computed:])
        self.kv.record_recompute(seq, self._timer() - start)

    def _decode(self, seqs: list[Sequence]) -> None:
        """One token for every running sequence, in one batched forward pass."""
        device = self.device
        positions = torch.tensor([s.num_computed for s in seqs], dtype=torch.long, device=device)
        tokens = torch.tensor([s.output[-1] for s in seqs], dtype=torch.long, device=device)
        past_k, past_v = self.kv.gather_batch(seqs)
        logits, new_k, new_v = self.model.decode(tokens, positions, past_k, past_v, positions)
        for i, seq in enumerate(seqs):
            self.kv.write(seq, seq.num_computed, new_k[:, i:i + 1], new_v[:, i:i + 1])
            seq.num_computed += 1
            self.kv.cache_full_blocks(seq)
            self._emit(seq, logits[i])

    def _forward(self, seq: Sequence, token_ids: list[int]) -> None:
        start_pos = seq.num_computed
        past_k, past_v = self.kv.gather(seq, start_pos)
        tokens = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        logits, new_k, new_v = self.model(tokens, start_pos, past_k, past_v)
        self.kv.write(seq, start_pos, new_k, new_v)
        seq.num_computed += len(token_ids)
        self.kv.cache_full_blocks(seq)
        self._emit(seq, logits)

    def _emit(self, seq: Sequence, logits) -> None:
        """Greedy sampling; hand the token to the request."""
        token = int(torch.argmax(logits))
        seq.output.append(token)
        seq.token_times_s.append(self._clock())
        seq.on_token(token)

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.finish(seq, self.kv)
        record = self._request_record(seq)
        self._recorder.record_request(record)
        if self._on_request is not None:
            self._on_request(record)
        seq.on_finish(seq)

    def _request_record(self, seq: Sequence, finish_status: str | None = None) -> RequestRecord:
        times = seq.token_times_s
        gaps = [b - a for a, b in zip(times, times[1:])]
        served = seq.served
        return RequestRecord(
            request_id=seq.request_id, arrival_s=seq.arrival_s, prompt_tokens=seq.prompt_len,
            output_tokens=len(seq.output),
            block_hashes=tuple(chain_hashes(seq.prompt, self.config.block_size_tokens, include_partial=True)),
            block_size_tokens=self.config.block_size_tokens, gpu_hit_tokens=served.gpu,
            cpu_promotion_tokens=served.cpu, cold_promotion_tokens=served.cold,
            recomputed_tokens=seq.prompt_len - served.gpu - served.cpu - served.cold,
            ttft_s=max(times[0] - seq.arrival_s, 0.0), itl_s=sum(gaps) / len(gaps) if gaps else None,
            e2e_latency_s=max(times[-1] - seq.arrival_s, 0.0), tier_config_id=seq.tier_config_id,
            finish_status=finish_status)

    def _apply_aborts(self) -> None:
        while not self._aborts.empty():
            seq, reason = self._aborts.get_nowait()
            if seq.finished or seq.error is not None:
                continue
            if seq in self.scheduler.running:
                self.scheduler.finish(seq, self.kv)
                if seq.token_times_s:  # it was served: its tier split and first token are real
                    self._recorder.record_request(self._request_record(seq, "aborted"))
            elif seq in self.scheduler.waiting:
                self.scheduler.waiting.remove(seq)
            seq.error = reason
            seq.on_finish(seq)

    def _apply_pending_tiers(self) -> None:
        if self._pending_tiers.empty() or self.scheduler.running:
            return
        while not self._pending_tiers.empty():
            tiers = self._pending_tiers.get_nowait()
        self._clear_caches()
        self.kv.close()
        try:
            self.kv = self._kv_manager(self.config.with_tiers(tiers))
        except (RuntimeError, MemoryError, OSError) as error:  # the machine changed since the check
            self.switch_error = f"tiers {tiers.config_id} could not be allocated: {error}"
            self.kv = self._kv_manager(self.config)  # back to the tiers that worked
            return
        self.config, self.switch_error = self.config.with_tiers(tiers), None

    def _kv_manager(self, config: EngineConfig) -> KvCacheManager:
        return KvCacheManager(config, self.device, self.dtype, self._recorder, self.events,
                              stats=self.transfers, timer=self._timer)

    def _clear_caches(self) -> None:
        """Evict every resident block, tier by tier, recorded and published as evictions."""
        self.kv.flush()
        for tier, hashes in self.kv.resident().items():
            for block_hash in hashes:
                self.kv.cascade.evicted(block_hash, tier)

    def fail_all(self, reason: str) -> None:
        """After a failed step: end every queued and running request with ``error`` set, so
        no client waits forever. Blocks are released on a best-effort basis."""
        while not self._incoming.empty():
            self.scheduler.add(self._incoming.get_nowait())
        doomed = list(self.scheduler.running) + list(self.scheduler.waiting)
        self.scheduler.waiting.clear()
        for seq in doomed:
            if seq in self.scheduler.running:
                try:
                    self.scheduler.finish(seq, self.kv)
                except Exception:  # the state that failed the step may fail this too
                    self.scheduler.running.remove(seq)
            seq.error = reason
            seq.on_finish(seq)

    @property
    def queued_requests(self) -> int:
        """Requests submitted and not yet admitted to the running batch."""
        return self._incoming.qsize() + len(self.scheduler.waiting)

    @property
    def switch_pending(self) -> bool:
        """A tier switch was asked for and waits for the running batch to drain."""
        return not self._pending_tiers.empty()

    @property
    def tier_config_id(self) -> str:
        return self.config.tiers.config_id

    def close(self) -> None:
        self.kv.close()
