"""kvtier's vLLM offloading specs (imports vLLM: vLLM loads it by module path).

Load it with (vLLM 0.32 and 0.33, ``OffloadingConnector`` with an out-of-tree spec)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "KvtierCPUOffloadingSpec",
        "spec_module_path": "kvtier.probes.vllm.spec", "cpu_bytes_to_use": 10737418240}}'

(``KvtierTieringOffloadingSpec`` for a CPU + ``fs`` configuration.)

``RecordingOffloadingManager`` delegates every call to vLLM's own manager and reports what
happened to a :class:`kvtier.probes.vllm.recording.ManagerRecorder`; the two specs build it around
the manager their vLLM base class builds. The ``kvtier_*`` keys of the extra config
(``probes/vllm/hook_settings.py``) say where the records are shipped.

vLLM 0.33 added manager methods 0.32 lacks (``lock``, ``config_info``, ``on_reset_flushed``):
the wrapper forwards them to the wrapped manager (0.32's scheduler never calls them) and
gives 0.32 callers of ``lock`` a no-op lock.
"""

from __future__ import annotations

from contextlib import nullcontext

from vllm.v1.kv_offload.base import LookupResult, OffloadingManager, PrepareStoreOutput
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.probes.vllm.recorders import flush, recorder_for
from kvtier.probes.vllm.recording import ManagerRecorder
from kvtier.probes.vllm.hook_settings import HookSettings

_MISS = LookupResult.MISS


class RecordingOffloadingManager(OffloadingManager):
    """vLLM's manager, unchanged, with each block decision recorded (see module doc).

    The scheduler calls these on its thread for every request step, so the wrapper adds as
    little as it can: the inner manager's methods are bound once, and a manager whose load
    source is always the host (vLLM's CPU manager) is not asked for it per chunk. Methods a
    newer vLLM adds are forwarded by binding them at construction, not by ``__getattr__``:
    a class with ``__getattr__`` loses CPython's fast attribute lookups, which doubled the
    cost of every call through the wrapper (0.2 vs 0.4 µs for a lookup).
    """

    def __init__(self, inner: OffloadingManager, observer: ManagerRecorder,
                 flush_timeout_s: float | None = None):
        self.inner = inner
        self.observer = observer
        self.flush_timeout_s = flush_timeout_s  # None: records are drained in process
        for name in dir(type(inner)):
            if not name.startswith("_") and not hasattr(RecordingOffloadingManager, name) \
                    and callable(getattr(type(inner), name)):
                setattr(self, name, getattr(inner, name))
        self._lookup, self._prepare_load = inner.lookup, inner.prepare_load
        self._complete_load = inner.complete_load
        self._prepare_store, self._complete_store = inner.prepare_store, inner.complete_store
        self._host_only = (type(inner).get_load_source
                           is CPUOffloadingManager.get_load_source)
        if isinstance(inner, CPUOffloadingManager) and inner.events is None:
            observer.track_evictions = False  # no removal events will ever come to match
        self.stores_paused = False  # kvtier's guardrail: pause_stores()

    @property
    def lock(self):
        # 0.33: callers hold the manager's lock; 0.32 managers have none (and no caller asks).
        return getattr(self.inner, "lock", None) or nullcontext()

    def lookup(self, key, req_context):
        result = self._lookup(key, req_context)
        if result is _MISS:
            self.observer.lookup(key, "MISS", req_context.req_id)
        return result

    def get_load_source(self, key, req_context):
        return self.inner.get_load_source(key, req_context)

    def prepare_load(self, keys, req_context):
        if type(keys) is not list:
            keys = list(keys)  # read twice below
        spec = self._prepare_load(keys, req_context)
        if self._host_only:
            sources = None  # all from the CPU tier
        else:
            source = self.inner.get_load_source
            sources = [getattr(source(k, req_context), "value", None) for k in keys]
        self.observer.prepared_load(keys, sources, req_context.req_id)
        return spec

    def touch(self, keys, req_context):
        return self.inner.touch(keys, req_context)

    def complete_load(self, keys, req_context):
        if type(keys) is not list:
            keys = list(keys)
        self._complete_load(keys, req_context)
        self.observer.completed_load(keys, req_context.req_id)

    def pause_stores(self, paused: bool) -> None:
        """kvtier's guardrail: while paused, every store is declined as nothing to store
        (vLLM's scheduler then moves past those chunks: they are not stored later either)."""
        self.stores_paused = paused

    def prepare_store(self, keys, req_context):
        if self.stores_paused:
            return PrepareStoreOutput(keys_to_store=[], store_spec=None, evicted_keys=[])
        output = self._prepare_store(keys, req_context)
        if output is not None:
            self.observer.prepared_store(output.keys_to_store, output.evicted_keys,
                                         req_context.req_id)
        return output

    def complete_store(self, keys, req_context, success=True):
        if type(keys) is not list:
            keys = list(keys)
        self._complete_store(keys, req_context, success)
        self.observer.completed_store(keys, success, req_context.req_id)

    def on_new_request(self, req_context):
        return self.inner.on_new_request(req_context)

    def on_request_finished(self, req_context):
        self.observer.request_finished(req_context.req_id)
        return self.inner.on_request_finished(req_context)

    def take_events(self):
        events = list(self.inner.take_events())
        self.observer.offloading_events(events)
        return events

    def on_schedule_end(self, context):
        return self.inner.on_schedule_end(context)

    def has_pending_work(self):
        return self.inner.has_pending_work()

    def reset_cache(self):
        return self.inner.reset_cache()

    def on_reset_flushed(self):  # 0.33 only
        return self.inner.on_reset_flushed()

    def get_stats(self):
        return self.inner.get_stats()

    def config_info(self):  # 0.33 only
        return self.inner.config_info()

    def shutdown(self):
        try:
            return self.inner.shutdown()
        finally:
            if self.flush_timeout_s is not None:
                flush(self.flush_timeout_s)


def _wrap(spec, manager: OffloadingManager) -> OffloadingManager:
    if isinstance(manager, RecordingOffloadingManager):
        return manager
    settings = HookSettings.from_extra_config(spec.extra_config)
    recorder = recorder_for(spec.config.engine_id, settings)
    chunk_bytes = getattr(spec, "kv_bytes_per_chunk", None) or getattr(
        spec, "aligned_kv_bytes_per_chunk", None)
    flush_timeout_s = settings.shipper.flush_timeout_s if settings.shipper is not None else None
    observer = ManagerRecorder(recorder, chunk_bytes=chunk_bytes, chunk_tokens=chunk_tokens(spec))
    return RecordingOffloadingManager(manager, observer, flush_timeout_s)


def chunk_tokens(spec) -> int | None:
    """Tokens one offloaded chunk holds: the engine's block size times ``blocks_per_chunk``
    (what vLLM's offloading scheduler counts as ``tokens_per_chunk``; an older spec's
    ``offloaded_block_size``). ``None`` when the cache groups differ in block size: a chunk's
    tokens then depend on its group."""
    per_block = set(getattr(spec, "tokens_per_block", ()) or ())
    blocks = getattr(spec, "blocks_per_chunk", None)
    if len(per_block) == 1 and isinstance(blocks, int):
        return per_block.pop() * blocks
    if not per_block:
        size = getattr(spec, "offloaded_block_size", None)
        return size if isinstance(size, int) else None
    return None


class KvtierCPUOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU spec, with the manager recorded."""

    def get_manager(self) -> OffloadingManager:
        if not isinstance(self._manager, RecordingOffloadingManager):
            self._manager = _wrap(self, super().get_manager())
        return self._manager


class KvtierTieringOffloadingSpec(TieringOffloadingSpec):
    """vLLM's CPU + secondary-tier spec, with the manager recorded."""

    def get_manager(self) -> OffloadingManager:
        if not isinstance(self._manager, RecordingOffloadingManager):
            self._manager = _wrap(self, super().get_manager())
        return self._manager
