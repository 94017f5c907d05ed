"""Per-request token attribution inside vLLM: how many prompt tokens each request got from
the GPU prefix cache, from the offload tiers (CPU, cold), and how many it recomputed.

Load it in place of vLLM's ``OffloadingConnector`` (same ``kv_connector_extra_config``)::

    {"kv_connector": "KvtierOffloadingConnector", "kv_connector_module_path":
     "probes.vllm.connector", "kv_role": "kv_both", "kv_connector_extra_config": {...}}

The connector is vLLM's own, with two observations added on the scheduler side:
``get_num_new_matched_tokens`` (the GPU hit is ``num_computed_tokens``, the offload hit is
the answer, split by tier with ``get_external_cache_hit_sources``) records one ``GPU_HIT``
per GPU-cached block, and ``request_finished`` records a :class:`RequestRecord` with the token
split. Per-block promotions and stores come from the spec wrapper (:mod:`probes.vllm.recording`),
which shares the engine's recorder.

:class:`RequestTokenAccounting` is the logic, free of vLLM types; the connector class is
built on first lookup (PEP 562), so this module imports without vLLM.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

from collector.events import Outcome, RequestRecord, Tier, block_hash_from_bytes

_COLD_SOURCES = ("disk", "p2p")


@dataclass
class _Pending:
    arrival_s: float
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    gpu_tokens: int
    cpu_tokens: int
    cold_tokens: int


def _as_hash(value) -> int:
    return block_hash_from_bytes(bytes(value)) if isinstance(value, (bytes, bytearray)) else int(value)


class RequestTokenAccounting:
    """Turn the scheduler's per-request match into block events and request records.

    ``block_size_tokens`` is the hash block size. A request is matched once per admission
    (again after a preemption: the latest match wins); unmatched requests are not reported.
    """

    def __init__(self, recorder, block_size_tokens: int, *, clock: Callable[[], float] = time.time,
                 max_pending: int = 100_000):
        if block_size_tokens <= 0:
            raise ValueError(f"block_size_tokens must be > 0, got {block_size_tokens!r}")
        self.recorder, self.block_size_tokens, self._clock = recorder, block_size_tokens, clock
        self._pending: dict[str, _Pending] = {}
        self._max_pending = max_pending

    def matched(self, request_id: str, *, arrival_s: float, prompt_tokens: int, block_hashes,
                gpu_tokens: int, external_tokens: int, sources: dict[str, int]) -> None:
        hashes = tuple(_as_hash(h) for h in block_hashes)
        now = self._clock()
        parent = None
        for position, block_hash in enumerate(hashes[:gpu_tokens // self.block_size_tokens]):
            self.recorder.record(Outcome.GPU_HIT, block_hash, request_id=request_id,
                                 parent_hash=parent, position=position,
                                 tokens=self.block_size_tokens, tier_to=Tier.GPU, time_s=now)
            parent = block_hash
        cold = sum(n for s, n in sources.items() if s in _COLD_SOURCES)
        if len(self._pending) < self._max_pending or request_id in self._pending:
            self._pending[request_id] = _Pending(arrival_s, prompt_tokens, hashes, gpu_tokens,
                                                 max(0, external_tokens - cold), cold)

    def finished(self, request_id: str, *, output_tokens: int | None = None) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return
        served = pending.gpu_tokens + pending.cpu_tokens + pending.cold_tokens
        self.recorder.record_request(RequestRecord(
            request_id=request_id, arrival_s=pending.arrival_s, prompt_tokens=pending.prompt_tokens,
            output_tokens=output_tokens, block_hashes=pending.block_hashes,
            block_size_tokens=self.block_size_tokens, gpu_hit_tokens=pending.gpu_tokens,
            cpu_promotion_tokens=pending.cpu_tokens, cold_promotion_tokens=pending.cold_tokens,
            recomputed_tokens=max(0, pending.prompt_tokens - served),
            e2e_latency_s=max(0.0, self._clock() - pending.arrival_s)))


def __getattr__(name: str):
    if name == "KvtierOffloadingConnector":
        return _connector_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _connector_class():
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )

    from probes.vllm.recorders import recorder_for

    class KvtierOffloadingConnector(OffloadingConnector):
        """vLLM's OffloadingConnector with per-request token attribution recorded."""

        def __init__(self, vllm_config, role, kv_cache_config):
            super().__init__(vllm_config, role, kv_cache_config)
            transfer = vllm_config.kv_transfer_config
            recorder = recorder_for(transfer.engine_id,
                                    transfer.kv_connector_extra_config.get("kvtier_instance"))
            self._kvtier = RequestTokenAccounting(recorder, vllm_config.cache_config.block_size)

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            external, is_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
            if external is not None:
                sources = self.get_external_cache_hit_sources(request, external) if external else {}
                self._kvtier.matched(
                    request.request_id, arrival_s=request.arrival_time,
                    prompt_tokens=request.num_prompt_tokens, block_hashes=request.block_hashes,
                    gpu_tokens=num_computed_tokens, external_tokens=external,
                    sources={getattr(s, "value", str(s)): n for s, n in sources.items()})
            return external, is_async

        def request_finished(self, request, block_ids):
            self._kvtier.finished(request.request_id, output_tokens=request.num_output_tokens)
            return super().request_finished(request, block_ids)

        def request_finished_all_groups(self, request, block_ids):
            self._kvtier.finished(request.request_id, output_tokens=request.num_output_tokens)
            return super().request_finished_all_groups(request, block_ids)

    return KvtierOffloadingConnector
