"""vLLM in-engine hooks: an out-of-tree ``OffloadingSpec`` whose manager records every block
decision of vLLM's real offloading manager into a kvtier :class:`collector.recorder.Recorder`.

Load it with (vLLM 0.33.0, ``shared/reference/vllm.md`` §4.2)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "KvtierCPUOffloadingSpec",
        "spec_module_path": "probes.vllm_hooks", "cpu_bytes_to_use": 10737418240}}'

(``KvtierTieringOffloadingSpec`` for a CPU + ``fs`` configuration.) The spec subclasses
vLLM's own spec and wraps the manager it builds, so vLLM's behaviour is unchanged; the
wrapper records, per chunk key:

* ``prepare_store`` -> ``EVICT`` (CPU) for each evicted key; ``complete_store`` -> ``STORE``
  GPU->CPU (or ``DROP`` on failure) with the prepare->complete time as ``latency_s``;
* ``prepare_load`` .. ``complete_load`` -> ``CPU_PROMOTION``, or ``COLD_PROMOTION`` when the
  manager says the chunk came from a secondary tier (``get_load_source`` = disk/p2p), with
  the scheduler-side prepare->complete time as ``latency_s``;
* ``lookup`` -> ``RECOMPUTE_MISS`` for the chunk that ended the request's offload prefix;
* ``take_events`` -> ``STORE`` CPU->COLD for chunks a secondary tier stored (only reported
  when vLLM's KV events are enabled).

This module imports vLLM only when one of those classes is first looked up (PEP 562
``__getattr__``), so it is importable, and testable, without vLLM. The recorder for a spec is
created from its ``engine_id`` and listed by :func:`active_recorders`; the collector's
flusher drains it off the engine's path.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from collector.events import Origin, Outcome, Tier

_RECORDERS: dict[str, object] = {}
_RECORDERS_LOCK = threading.Lock()
_COLD_SOURCES = frozenset({"disk", "p2p"})


def key_hash(key: bytes) -> int:
    """An ``OffloadKey`` (block hash bytes + 4-byte group index) -> the schema's hash."""
    return int.from_bytes(key[-12:-4], "big")  # == block_hash_from_bytes(key[:-4]), one slice


class ManagerRecorder:
    """The recording logic, free of vLLM types: the wrapper calls one method per manager call.

    Keys are ``OffloadKey`` bytes; ``request_id`` is vLLM's ``req_id``; ``size_bytes`` is the
    chunk size (every worker together). Pending prepare times are kept per key.
    """

    def __init__(self, recorder, *, chunk_bytes: int | None = None,
                 clock: Callable[[], float] = time.time):
        self.recorder = recorder
        self.chunk_bytes = chunk_bytes
        self._clock = clock
        self._store_started: dict[bytes, float] = {}
        self._load_started: dict[bytes, tuple[float, Outcome]] = {}
        self._evictions_seen: set[bytes] = set()  # reported at prepare_store, not again
        self._misses: dict[str, set] = {}  # request -> keys already reported missing

    def lookup(self, key: bytes, result: str, request_id: str) -> None:
        """A waiting request is looked up again every step: report each miss once."""
        if result != "MISS":
            return
        seen = self._misses.setdefault(request_id, set())
        if key not in seen and len(self._misses) <= 100_000:
            seen.add(key)
            self.recorder.record(Outcome.RECOMPUTE_MISS, key_hash(key), request_id=request_id)

    def request_finished(self, request_id: str) -> None:
        self._misses.pop(request_id, None)

    def prepared_store(self, keys_to_store, evicted_keys, request_id: str) -> None:
        now = self._clock()
        for key in evicted_keys:
            self.recorder.record(Outcome.EVICT, key_hash(key), tier_from=Tier.CPU, time_s=now)
            if len(self._evictions_seen) < 1_000_000:
                self._evictions_seen.add(key)
        for key in keys_to_store:
            self._store_started[key] = now

    def completed_store(self, keys, success: bool, request_id: str) -> None:
        now = self._clock()
        for key in keys:
            started = self._store_started.pop(key, None)
            if started is None:
                continue  # not ours to report: already stored, or filtered by the manager
            if success:
                self.recorder.record(Outcome.STORE, key_hash(key), request_id=request_id,
                                     size_bytes=self.chunk_bytes, tier_from=Tier.GPU,
                                     tier_to=Tier.CPU, latency_s=now - started, time_s=now)
            else:
                self.recorder.record(Outcome.DROP, key_hash(key), request_id=request_id,
                                     tier_from=Tier.GPU, time_s=now)

    def prepared_load(self, keys, sources, request_id: str) -> None:
        now = self._clock()
        for key, source in zip(keys, sources):
            cold = source in _COLD_SOURCES
            self._load_started[key] = (now, Outcome.COLD_PROMOTION if cold else Outcome.CPU_PROMOTION)

    def completed_load(self, keys, request_id: str) -> None:
        now = self._clock()
        for key in keys:
            started = self._load_started.pop(key, None)
            if started is None:
                continue
            began, outcome = started
            tier_from = Tier.COLD if outcome is Outcome.COLD_PROMOTION else Tier.CPU
            self.recorder.record(outcome, key_hash(key), request_id=request_id,
                                 size_bytes=self.chunk_bytes, tier_from=tier_from,
                                 tier_to=Tier.GPU, latency_s=now - began, time_s=now)

    def offloading_events(self, events) -> None:
        """vLLM ``OffloadingEvent``s add what the manager did on its own: stores into a
        secondary tier, and CPU evictions made room for a promotion (not via prepare_store)."""
        now = self._clock()
        for event in events:
            medium = getattr(event.medium, "value", event.medium)
            if event.metadata_only:
                continue
            if medium == "CPU" and event.removed:
                self._cpu_removals(event.keys, now)
                continue
            if medium != "STORAGE":
                continue
            for key in event.keys:
                if event.removed:
                    self.recorder.record(Outcome.EVICT, key_hash(key), tier_from=Tier.COLD,
                                         time_s=now)
                else:
                    self.recorder.record(Outcome.STORE, key_hash(key), tier_from=Tier.CPU,
                                         tier_to=Tier.COLD, size_bytes=self.chunk_bytes,
                                         time_s=now)


    def _cpu_removals(self, keys, now: float) -> None:
        for key in keys:
            if key in self._evictions_seen:
                self._evictions_seen.discard(key)
            else:
                self.recorder.record(Outcome.EVICT, key_hash(key), tier_from=Tier.CPU, time_s=now)


def recorder_for(engine_id: str, instance: str | None = None, *, clock=time.time):
    """The process-wide recorder of one engine (created on first use)."""
    from collector.recorder import Recorder

    with _RECORDERS_LOCK:
        recorder = _RECORDERS.get(engine_id)
        if recorder is None:
            source = f"vllm-hooks:{instance or engine_id}:{engine_id}:{int(clock() * 1000)}"
            recorder = Recorder(Origin("vllm", instance or engine_id, source), clock=clock)
            _RECORDERS[engine_id] = recorder
        return recorder


def active_recorders() -> dict[str, object]:
    """engine_id -> recorder, for the flusher that drains them."""
    with _RECORDERS_LOCK:
        return dict(_RECORDERS)


def __getattr__(name: str):
    # vLLM's OffloadingSpecFactory does getattr(import_module(spec_module_path), spec_name).
    if name in ("KvtierCPUOffloadingSpec", "KvtierTieringOffloadingSpec",
                "RecordingOffloadingManager"):
        from probes import vllm_hooks_classes

        return getattr(vllm_hooks_classes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
