"""The recorder: what engine hooks call on their hot path.

``record(...)`` packs one block event into a fixed-width binary record appended to a
``bytearray`` and returns; it never blocks and never raises into the engine. When the
buffer is full the event is dropped and counted. Draining happens off the engine's path:
``take_packed()`` hands over the packed records as bytes (what the engine-side shipper sends
to the collector; standard library and numpy only, so it runs inside an engine process), and
``take_events()`` (an in-process flusher) turns them into an ``EventBatch`` with no per-event
Python work: the bytes are viewed as a numpy structured array, column by column.

Step records (``record_step``, one per engine scheduler step: a few hundred a second at most)
are kept as plain tuples in the schema's field order in a bounded list; the collector
validates them when it converts the batch.
Tier moves (``record_move``: the guardrail's pauses and resumes an engine applied, a few an
hour) are kept the same way, and ``guardrail_rejected`` counts control messages the engine
dropped, by reason: cumulative, carried by every batch (``take_packed`` makes one when only
those counts changed).

Why bytes and not a list of tuples: transposing a million Python tuples into columns costs
about a second of GIL time; unpacking packed records costs about a tenth of that.

Thread safety under the GIL: ``bytearray += bytes`` is one C call, so records never
interleave; draining copies the first ``n`` bytes and deletes exactly those, so a record
appended while draining stays for the next batch.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from kvtier.collector.events import Origin, RequestRecord
from kvtier.collector.packed_batch import PackedBatch
from kvtier.collector.record_layout import DTYPE, HASH_AT, NULL_BIT, RECORD, RECORD_BYTES, RUN_NULLS


class _RequestKeys:
    """Maps request-id strings to small ints for the packed records.

    Two generations are kept so a key handed out just before a drain still decodes after
    it; the table is rotated by the drainer once it grows past ``rotate_after`` names.
    """

    def __init__(self, rotate_after: int = 65536):
        self._lock = threading.Lock()
        self._rotate_after = rotate_after
        self._generation = 0
        self._keys: dict[str, int] = {}
        self._names: list[str] = []
        self._previous: list[str] = []

    def key(self, request_id: str) -> int:
        key = self._keys.get(request_id)
        if key is None:
            key = self._add(request_id)
        return key

    def _add(self, request_id: str) -> int:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        with self._lock:
            key = self._keys.get(request_id)
            if key is None:
                key = (self._generation & 1) << 31 | len(self._names)
                self._names.append(request_id)
                self._keys[request_id] = key
            return key

    def local(self, keys: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
        """Packed keys -> (batch-local indices, the names they index). Rotates the table once
        it has grown past ``rotate_after`` names (keys of both generations still resolve)."""
        with self._lock:
            current, previous, generation = list(self._names), self._previous, self._generation
            if len(self._names) > self._rotate_after:
                self._generation += 1
                self._previous, self._names, self._keys = self._names, [], {}
        index = (keys & 0x7FFFFFFF).astype(np.int64)
        from_previous = (keys >> 31) != (generation & 1)
        index = np.where(from_previous, index, index + len(previous))
        used, local = np.unique(index, return_inverse=True)
        table = previous + current
        return local.astype(np.uint32), tuple(table[i] for i in used.tolist())


class Recorder:
    """A bounded, non-blocking buffer of block events, request records and step records for
    one origin.

    ``capacity_events`` bounds the buffered block events (about 80 bytes each); events past
    it are dropped and counted in ``dropped_events``. Calls that fail to pack (a wrong type)
    are counted in ``rejected_events``; range errors are caught when draining. Request and
    step records past ``capacity_requests`` / ``capacity_steps`` are dropped and counted in
    ``dropped_requests`` / ``dropped_steps``.
    """

    def __init__(self, origin: Origin, *, capacity_events: int = 1 << 20,
                 capacity_requests: int = 1 << 16, capacity_steps: int = 1 << 16,
                 clock: Callable[[], float] = time.time, first_sequence: int = 0,
                 capacity_moves: int = 1 << 12):
        if capacity_events <= 0 or capacity_requests <= 0 or capacity_steps <= 0:
            raise ValueError(f"capacities must be positive, got {capacity_events}, "
                             f"{capacity_requests}, {capacity_steps}")
        self.origin = origin
        self._clock = clock
        self._buffer = bytearray()
        self._limit_bytes = capacity_events * RECORD_BYTES
        self._requests: list[RequestRecord] = []
        self._capacity_requests = capacity_requests
        self._steps: list[tuple] = []
        self._capacity_steps = capacity_steps
        self._moves: list[tuple] = []
        self._capacity_moves = capacity_moves
        self.guardrail_rejected: dict[str, int] = {}  # control messages dropped, by reason
        self._rejections_shipped: dict[str, int] = {}
        self._keys = _RequestKeys()
        self._pack = RECORD.pack
        self._sequence = first_sequence
        self._drain_lock = threading.Lock()
        self.dropped_events = 0
        self.dropped_requests = 0
        self.dropped_steps = 0
        self.rejected_events = 0

    def record(self, kind, block_hash, request_id=None, parent_hash=None, position=None,
               tokens=None, size_bytes=None, tier_from=None, tier_to=None, priority=None,
               latency_s=None, time_s=None) -> None:
        """Buffer one block event (see ``BlockEvent`` for the fields). Never raises."""
        buffer = self._buffer
        if len(buffer) >= self._limit_bytes:
            self.dropped_events += 1
            return
        try:
            nulls = 0
            if request_id is None:
                nulls, key = 1, 0
            else:
                key = self._keys.key(request_id)
            if parent_hash is None:
                nulls |= 2; parent_hash = 0
            if position is None:
                nulls |= 4; position = 0
            if tokens is None:
                nulls |= 8; tokens = 0
            if size_bytes is None:
                nulls |= 16; size_bytes = 0
            if tier_from is None:
                nulls |= 32; tier_from = 0
            if tier_to is None:
                nulls |= 64; tier_to = 0
            if priority is None:
                nulls |= 128; priority = 0
            if latency_s is None:
                nulls |= 256; latency_s = 0.0
            buffer += self._pack(self._clock() if time_s is None else time_s, block_hash,
                                 parent_hash, latency_s, size_bytes, key, position, tokens,
                                 nulls, kind, tier_from, tier_to, priority)
        except Exception:  # a hook must never be broken by its observer
            self.rejected_events += 1

    def record_run(self, kind, hashes_le, request_id=None, size_bytes=None, tier_from=None,
                   tier_to=None, latency_s=None, time_s=None, tokens=None) -> bool:
        """Buffer one ``kind`` event per block hash, every other field shared: the events of
        one engine call, packed once and appended in one C call (a drain never splits the
        run). ``hashes_le``: each hash as its 8 little-endian bytes, so a caller holding the
        hash as bytes (a vLLM offload key) skips building an ``int``. ``tokens`` is each
        block's token count; parent, position and priority are null. Returns ``False``,
        recording nothing, when a value does not fit the packed form (a hash not 8 bytes, a
        wrong type): the caller then uses :meth:`record` per event, which counts rejections.
        Events past the capacity are dropped and counted, as with :meth:`record`."""
        buffer = self._buffer
        free_bytes = self._limit_bytes - len(buffer)
        n = len(hashes_le)
        if not n:
            return True
        if free_bytes <= 0:
            self.dropped_events += n
            return True
        try:
            nulls = RUN_NULLS
            if request_id is None:
                nulls, request_key = nulls | 1, 0
            else:
                request_key = self._keys.key(request_id)
            if tokens is None:
                nulls, tokens = nulls | 8, 0
            if size_bytes is None:
                nulls, size_bytes = nulls | 16, 0
            if tier_from is None:
                nulls, tier_from = nulls | 32, 0
            if tier_to is None:
                nulls, tier_to = nulls | 64, 0
            if latency_s is None:
                nulls, latency_s = nulls | 256, 0.0
            record = self._pack(self._clock() if time_s is None else time_s, 0, 0, latency_s,
                                size_bytes, request_key, 0, tokens, nulls, kind, tier_from, tier_to, 0)
            head, tail = record[:HASH_AT], record[HASH_AT + 8:]
            run = head + (tail + head).join(hashes_le) + tail
        except Exception:
            return False
        if len(run) != RECORD_BYTES * n:  # a hash that is not 8 bytes
            return False
        if len(run) > free_bytes:  # keep the records that fit, as record() would
            kept = -(-free_bytes // RECORD_BYTES)
            self.dropped_events += n - kept
            run = run[:kept * RECORD_BYTES]
        buffer += run
        return True

    def record_request(self, record: RequestRecord) -> None:
        """Buffer one request record. Never raises; drops (counted) when full."""
        if len(self._requests) >= self._capacity_requests:
            self.dropped_requests += 1
            return
        self._requests.append(record)

    def record_step(self, time_s, step, duration_s=None, prefill_tokens=0, prefill_requests=0,
                    prefill_context_tokens=0, cached_tokens=0, decode_requests=0,
                    decode_context_tokens=0, running_requests=0, waiting_requests=0,
                    preempted_requests=0, loaded_bytes=0, stored_bytes=0) -> None:
        """Buffer one scheduler step (the fields of ``StepRecord``, in its order). Never raises:
        one tuple appended, or dropped and counted when ``capacity_steps`` are buffered;
        values are validated when the collector converts the batch."""
        if len(self._steps) >= self._capacity_steps:
            self.dropped_steps += 1
            return
        self._steps.append((time_s, step, duration_s, prefill_tokens, prefill_requests,
                            prefill_context_tokens, cached_tokens, decode_requests,
                            decode_context_tokens, running_requests, waiting_requests,
                            preempted_requests, loaded_bytes, stored_bytes))

    def record_move(self, time_s, action, direction, tier, actor, mode=None, reason=None,
                    tier_config_id=None, ttft_p99_s=None, itl_p99_s=None, budget_s=None,
                    command=None) -> None:
        """Buffer one tier move (the fields of ``TierMove``, in its order). Never raises; beyond
        ``capacity_moves`` buffered it drops and counts them in ``dropped_events``."""
        if len(self._moves) >= self._capacity_moves:
            self.dropped_events += 1
            return
        self._moves.append((time_s, action, direction, tier, actor, mode, reason, tier_config_id,
                            ttft_p99_s, itl_p99_s, budget_s, command))

    def take_packed(self) -> PackedBatch | None:
        """Drain everything buffered, still packed (no Arrow work: an engine process calls
        this). ``None`` when nothing (and no rejection) is pending. One drainer at a time (a
        lock enforces it); appends may continue concurrently."""
        with self._drain_lock:
            return self._take_packed_locked()

    def take_events(self):
        """Drain everything buffered into one ``EventBatch`` with the next sequence number
        (imports pyarrow: for a drainer in the collector's process), or ``None``."""
        with self._drain_lock:
            packed = self._take_packed_locked()
            if packed is None:
                return None
            batch = packed.to_event_batch(self._sequence)
            self._sequence += 1
            return batch

    def _take_packed_locked(self) -> PackedBatch | None:
        size = len(self._buffer)
        size -= size % RECORD_BYTES
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        count = len(self._requests)
        requests = tuple(self._requests[:count])
        del self._requests[:count]
        count = len(self._steps)
        steps = tuple(self._steps[:count])
        del self._steps[:count]
        moves = tuple(self._moves[:len(self._moves)])
        del self._moves[:len(moves)]
        rejected_calls, self.rejected_events = self.rejected_events, 0
        guardrail_rejected = dict(self.guardrail_rejected)
        news = guardrail_rejected != self._rejections_shipped
        self._rejections_shipped = guardrail_rejected
        if not data and not requests and not steps and not moves and not rejected_calls \
                and not news:
            return None
        names: tuple[str, ...] = ()
        if data:
            packed = np.frombuffer(data, dtype=DTYPE).copy()
            named = (packed["nulls"] & NULL_BIT["request_id"]) == 0
            if named.any():
                local, names = self._keys.local(packed["request_key"][named])
                packed["request_key"][named] = local
            data = packed.tobytes()
        return PackedBatch(self.origin, data, names, requests, rejected_calls, steps, moves,
                           tuple(sorted(guardrail_rejected.items())))
