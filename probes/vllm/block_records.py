"""The hooks' hot path: one manager call's block events appended to a recorder at once.

A manager call reports several chunks that share every field but the hash (kind, time,
request, tokens, size, tiers, latency). :meth:`kvtier.collector.recorder.Recorder.record` packs them one
by one (about 0.9 µs each, most of it keyword-argument handling and ``None`` checks);
:meth:`~kvtier.collector.recorder.Recorder.record_run` packs the shared record once and appends
the whole run in one C call, so a run is never split by the drainer.

The hash needs no ``int``: the schema's hash is the 8 bytes before the group index read
big-endian (:func:`key_hash`), and the record stores it little-endian, so the record's 8
bytes are those same bytes reversed, one slice of the key. Anything the run cannot hold (a
recorder without ``record_run``, keys too short to hold a hash, a request id that is not a
``str``) goes through ``recorder.record`` one chunk at a time, which counts its rejections.
"""

from __future__ import annotations

from operator import itemgetter

# The record's 8 hash bytes, little-endian: the 8 before the group index, reversed.
_hash_le = itemgetter(slice(-5, -13, -1))


def key_hash(key: bytes) -> int:
    """An ``OffloadKey`` (block hash bytes + 4-byte group index) -> the schema's hash."""
    return int.from_bytes(key[-12:-4], "big")  # == block_hash_from_bytes(key[:-4]), one slice


class BlockRecords:
    """Appends runs of block events (one per key, all other fields shared) to ``recorder``."""

    __slots__ = ("_run", "recorder")

    def __init__(self, recorder):
        self.recorder = recorder
        self._run = getattr(recorder, "record_run", None)  # test doubles may lack it

    def add(self, kind: int, keys: list, request_id=None, size_bytes=None, tier_from=None,
            tier_to=None, latency_s=None, time_s=None, tokens=None) -> None:
        """One ``kind`` event per key in ``keys`` (a list), in order, each covering ``tokens``
        tokens. Never raises.

        Pass codes as plain ints (``int(Outcome.STORE)``): packing an ``IntEnum`` costs more.
        """
        if not keys:
            return
        run = self._run
        if run is not None and run(kind, list(map(_hash_le, keys)), request_id, size_bytes,
                                   tier_from, tier_to, latency_s, time_s, tokens):
            return
        record = self.recorder.record
        for key in keys:
            record(kind, key_hash(key), request_id=request_id, tokens=tokens,
                   size_bytes=size_bytes, tier_from=tier_from, tier_to=tier_to,
                   latency_s=latency_s, time_s=time_s)
