"""What kvtier's vLLM offloading spec records, free of vLLM types.

The spec (:mod:`kvtier.probes.vllm.spec`, loaded by vLLM with ``spec_module_path: kvtier.probes.vllm.spec``)
wraps vLLM's own offloading manager and calls one :class:`ManagerRecorder` method per manager
call; the recorder records, per chunk key:

* ``prepare_store`` -> ``EVICT`` (CPU) for each evicted key; ``complete_store`` -> ``STORE``
  GPU->CPU (or ``DROP`` on failure) with the prepare->complete time as ``latency_s``;
* ``prepare_load`` .. ``complete_load`` -> ``CPU_PROMOTION``, or ``COLD_PROMOTION`` when the
  manager says the chunk came from a secondary tier (``get_load_source`` = disk/p2p), with
  the scheduler-side prepare->complete time as ``latency_s``;
* ``lookup`` -> ``RECOMPUTE_MISS`` for the chunk that ended the request's offload prefix;
* ``take_events`` -> ``STORE`` CPU->COLD for chunks a secondary tier stored (only reported
  when vLLM's KV events are enabled).

Events go to the engine's process-wide recorder (:func:`kvtier.probes.vllm.recorders.recorder_for`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from itertools import repeat

from kvtier.collector.events import Origin, Outcome, Tier
from kvtier.probes.vllm.block_records import BlockRecords, key_hash

_COLD_SOURCES = frozenset({"disk", "p2p"})
_MAX_REQUESTS_TRACKED = 100_000
_MAX_EVICTIONS_TRACKED = 1_000_000
# Codes as plain ints, bound once: an enum attribute costs ~75 ns a lookup, and more to pack.
_STORE, _EVICT, _DROP = int(Outcome.STORE), int(Outcome.EVICT), int(Outcome.DROP)
_MISS, _CPU_PROMOTION = int(Outcome.RECOMPUTE_MISS), int(Outcome.CPU_PROMOTION)
_COLD_PROMOTION = int(Outcome.COLD_PROMOTION)
_GPU, _CPU, _COLD = int(Tier.GPU), int(Tier.CPU), int(Tier.COLD)

__all__ = ["ManagerRecorder", "key_hash"]


class ManagerRecorder:
    """The recording logic, free of vLLM types: the wrapper calls one method per manager call.

    Keys are ``OffloadKey`` bytes; ``request_id`` is vLLM's ``req_id``; ``chunk_bytes`` is the
    chunk size (every worker together) and ``chunk_tokens`` the tokens one chunk holds (the
    offloaded block size: vLLM's block size times ``blocks_per_chunk``), which every event
    carries, so a promotion's tokens add up to vLLM's ``external_prefix_cache_hits``. Pending prepare times are kept per key. Runs on the
    engine's scheduler thread: each call reads the clock once and appends its events as runs
    (:class:`kvtier.probes.vllm.block_records.BlockRecords`), nothing per chunk but dict updates.
    """

    def __init__(self, recorder, *, chunk_bytes: int | None = None,
                 chunk_tokens: int | None = None, clock: Callable[[], float] = time.time):
        self.recorder = recorder
        self.chunk_bytes, self.chunk_tokens = chunk_bytes, chunk_tokens
        self._clock = clock
        self._add = partial(BlockRecords(recorder).add, tokens=chunk_tokens)
        self._store_started: dict[bytes, float] = {}
        self._load_started: dict[bytes, tuple[float, int]] = {}  # (prepared at, outcome)
        # Evictions reported at prepare_store, so the manager's own CPU removal event does
        # not report them again. Off when the manager emits no events (see the wrapper):
        # nothing would ever take the keys out again.
        self.track_evictions = True
        self._evictions_seen: set[bytes] = set()
        self._misses: dict[str, set] = {}  # request -> keys already reported missing
        self._step_chunks = [0, 0]  # chunks prepared to load, to store, since take_step_bytes
        self._loading: dict[str, int] = {}  # request -> chunks of its load job in flight
        self._loading_chunks = 0

    def lookup(self, key: bytes, result: str, request_id: str) -> None:
        """A waiting request is looked up again every step: report each miss once."""
        if result != "MISS":
            return
        seen = self._misses.get(request_id)
        if seen is None:
            seen = self._misses[request_id] = set()
        if key not in seen and len(self._misses) <= _MAX_REQUESTS_TRACKED:
            seen.add(key)
            self._add(_MISS, [key], request_id)

    def request_finished(self, request_id: str) -> None:
        self._misses.pop(request_id, None)
        self._loading_chunks -= self._loading.pop(request_id, 0)

    def take_step_bytes(self) -> tuple[int, int]:
        """Bytes prepared to load into and to store out of the GPU since the last call (the
        connector's step records); 0 when the chunk size is unknown."""
        loads, stores = self._step_chunks
        self._step_chunks = [0, 0]
        per_chunk = self.chunk_bytes or 0
        return loads * per_chunk, stores * per_chunk

    def load_queue(self) -> tuple[int, int]:
        """Load jobs in flight (prepared, not completed) and their bytes (0 when the chunk
        size is unknown): the queue a new load waits behind."""
        return len(self._loading), self._loading_chunks * (self.chunk_bytes or 0)

    def prepared_store(self, keys_to_store, evicted_keys, request_id: str) -> None:
        now = self._clock()
        self._step_chunks[1] += len(keys_to_store)
        if evicted_keys:
            if type(evicted_keys) is not list:
                evicted_keys = list(evicted_keys)
            self._add(_EVICT, evicted_keys, tier_from=_CPU, time_s=now)
            if self.track_evictions:
                self._track(evicted_keys)
        self._store_started.update(zip(keys_to_store, repeat(now)))

    def completed_store(self, keys, success: bool, request_id: str) -> None:
        now = self._clock()
        # Keys prepared together share one start time: one run each. Keys not prepared
        # (already stored, or filtered by the manager) are not ours to report.
        for started, run in _runs(self._store_started.pop, keys):
            if success:
                self._add(_STORE, run, request_id, self.chunk_bytes, _GPU, _CPU, now - started,
                          now)
            else:
                self._add(_DROP, run, request_id, tier_from=_GPU, time_s=now)

    def prepared_load(self, keys, sources, request_id: str) -> None:
        """``sources`` are the manager's load source labels per key (``"host"``, ``"disk"``,
        ...), or ``None`` when all come from the CPU tier."""
        now = self._clock()
        self._step_chunks[0] += len(keys)
        self._loading_chunks += len(keys) - self._loading.get(request_id, 0)
        self._loading[request_id] = len(keys)
        warm = (now, _CPU_PROMOTION)
        if sources is None:
            self._load_started.update(zip(keys, repeat(warm)))
            return
        cold, started = (now, _COLD_PROMOTION), self._load_started
        for key, source in zip(keys, sources):
            started[key] = cold if source in _COLD_SOURCES else warm

    def completed_load(self, keys, request_id: str) -> None:
        now = self._clock()
        self._loading_chunks -= self._loading.pop(request_id, 0)
        for (began, outcome), run in _runs(self._load_started.pop, keys):
            tier_from = _COLD if outcome == _COLD_PROMOTION else _CPU
            self._add(outcome, run, request_id, self.chunk_bytes, tier_from, _GPU, now - began,
                      now)

    def offloading_events(self, events) -> None:
        """vLLM ``OffloadingEvent``s add what the manager did on its own: stores into a
        secondary tier, and CPU evictions made room for a promotion (not via prepare_store)."""
        now = self._clock()
        for event in events:
            medium = getattr(event.medium, "value", event.medium)
            if getattr(event, "metadata_only", False):  # 0.33: failed-store cleanup, unpublished
                continue
            if medium == "CPU" and event.removed:
                self._cpu_removals(event.keys, now)
                continue
            if medium != "STORAGE":
                continue
            if event.removed:
                self._add(_EVICT, list(event.keys), tier_from=_COLD, time_s=now)
            else:
                self._add(_STORE, list(event.keys), size_bytes=self.chunk_bytes,
                          tier_from=_CPU, tier_to=_COLD, time_s=now)

    def _track(self, evicted_keys: list) -> None:
        seen = self._evictions_seen
        if len(seen) + len(evicted_keys) <= _MAX_EVICTIONS_TRACKED:
            seen.update(evicted_keys)
            return
        for key in evicted_keys:
            if len(seen) < _MAX_EVICTIONS_TRACKED:
                seen.add(key)

    def _cpu_removals(self, keys, now: float) -> None:
        seen, unseen = self._evictions_seen, []
        for key in keys:
            if key in seen:
                seen.discard(key)
            else:
                unseen.append(key)
        self._add(_EVICT, unseen, tier_from=_CPU, time_s=now)


def _runs(pop, keys: list) -> list:
    """``(started, keys)`` for each run of consecutive keys whose ``pop(key, None)`` is
    equal, in order; keys it pops nothing for are left out."""
    started = list(map(pop, keys, repeat(None)))  # one C loop
    if started and started[0] is not None and started.count(started[0]) == len(started):
        return [(started[0], keys)]  # the usual call: keys prepared together
    runs = []
    for key, began in zip(keys, started):
        if began is None:
            continue
        if runs and runs[-1][0] == began:
            runs[-1][1].append(key)
        else:
            runs.append((began, [key]))
    return runs
