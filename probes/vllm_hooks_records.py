"""The hooks' hot path: one manager call's block events packed into a recorder at once.

A manager call reports several chunks that share every field but the hash (kind, time,
request, size, tiers, latency). :meth:`collector.recorder.Recorder.record` packs them one
by one (about 0.9 µs each, most of it keyword-argument handling and ``None`` checks); here
a call packs one 64-byte record, repeats it around the chunks' hashes with a single
``bytes.join`` and appends the run with a single ``bytearray +=``. That is one C call, so a
run is never split by the drainer, as a single ``record`` is not.

The hash needs no ``int``: the schema's hash is the 8 bytes before the group index read
big-endian (:func:`probes.vllm_hooks.key_hash`), and the record stores it little-endian, so
the record's 8 bytes are those same bytes reversed, one slice of the key.

The bytes are exactly what ``Recorder.record`` writes (same struct, null bits, request keys,
drop counting; ``tests/probes/test_vllm_hooks.py`` compares them), which is why this reads the
recorder's private layout. Anything it does not expect (another recorder type, keys too short
to hold a hash, a request id that is not a ``str``) goes through ``recorder.record`` one chunk
at a time, which counts its rejections as before.
"""

from __future__ import annotations

from operator import itemgetter

from collector.recorder import _NULL_BIT, _RECORD, RECORD_BYTES, Recorder

# Fields the hooks never set: always null in their records.
_ALWAYS_NULL = _NULL_BIT["parent_hash"] | _NULL_BIT["position"] | _NULL_BIT["tokens"] | \
    _NULL_BIT["priority"]
_NULL_REQUEST, _NULL_SIZE = _NULL_BIT["request_id"], _NULL_BIT["size_bytes"]
_NULL_FROM, _NULL_TO, _NULL_LATENCY = _NULL_BIT["tier_from"], _NULL_BIT["tier_to"], \
    _NULL_BIT["latency_s"]
_TIME_END, _HASH_END = 8, 16  # a record starts with time_s (8 bytes), then block_hash (8)
_pack = _RECORD.pack
# The record's 8 hash bytes, little-endian: the 8 before the group index, reversed.
_hash_le = itemgetter(slice(-5, -13, -1))


def key_hash(key: bytes) -> int:
    """An ``OffloadKey`` (block hash bytes + 4-byte group index) -> the schema's hash."""
    return int.from_bytes(key[-12:-4], "big")  # == block_hash_from_bytes(key[:-4]), one slice


class BlockRecords:
    """Appends runs of block events (one per key, all other fields shared) to ``recorder``."""

    __slots__ = ("_packed", "recorder")

    def __init__(self, recorder):
        self.recorder = recorder
        # Only kvtier's own recorder has the layout packed here; test doubles get record().
        self._packed = type(recorder) is Recorder and _RECORD.size == RECORD_BYTES

    def add(self, kind: int, keys: list, request_id=None, size_bytes=None, tier_from=None,
            tier_to=None, latency_s=None, time_s=None) -> None:
        """One ``kind`` event per key in ``keys`` (a list), in order. Never raises.

        Pass codes as plain ints (``int(Outcome.STORE)``): packing an ``IntEnum`` costs more.
        """
        if not keys:
            return
        recorder = self.recorder
        if self._packed:
            buffer = recorder._buffer
            free_bytes = recorder._limit_bytes - len(buffer)
            if free_bytes <= 0:  # full: nothing to pack
                recorder.dropped_events += len(keys)
                return
            try:  # a field left None is packed as 0 with its null bit set
                nulls, request_key, size, source, target, latency = _ALWAYS_NULL, 0, 0, 0, 0, 0.0
                if request_id is None:
                    nulls |= _NULL_REQUEST
                else:
                    request_key = recorder._keys.key(request_id)
                if size_bytes is None:
                    nulls |= _NULL_SIZE
                else:
                    size = size_bytes
                if tier_from is None:
                    nulls |= _NULL_FROM
                else:
                    source = tier_from
                if tier_to is None:
                    nulls |= _NULL_TO
                else:
                    target = tier_to
                if latency_s is None:
                    nulls |= _NULL_LATENCY
                else:
                    latency = latency_s
                when = recorder._clock() if time_s is None else time_s
                if len(keys) == 1:
                    run = _pack(when, key_hash(keys[0]), 0, latency, size, request_key, 0, 0,
                                nulls, kind, source, target, 0)
                else:
                    record = _pack(when, 0, 0, latency, size, request_key, 0, 0, nulls, kind,
                                   source, target, 0)
                    head, tail = record[:_TIME_END], record[_HASH_END:]
                    run = head + (tail + head).join(map(_hash_le, keys)) + tail
            except Exception:  # a key or value the packed form cannot hold: record() decides
                run = b""
            if len(run) == RECORD_BYTES * len(keys):  # else a key too short for a hash
                if len(run) > free_bytes:  # record() would drop the events past the limit
                    kept = -(-free_bytes // RECORD_BYTES)
                    recorder.dropped_events += len(keys) - kept
                    run = run[:kept * RECORD_BYTES]
                buffer += run
                return
        record = recorder.record
        for key in keys:
            record(kind, key_hash(key), request_id=request_id, size_bytes=size_bytes,
                   tier_from=tier_from, tier_to=tier_to, latency_s=latency_s, time_s=time_s)
