"""Decode vLLM KV-event frames into kvtier block events (pure: bytes in, records out).

Wire format (vLLM 0.33.0, ``vllm/distributed/kv_events.py``; see
``vllm/distributed/kv_events.py``): a ZMQ multipart message ``[topic, seq, payload]`` where
``seq`` is 8 bytes big-endian and ``payload`` is msgpack ``[ts, events, dp_rank]``
(``dp_rank`` may be omitted). Each event is either

* map-encoded (vLLM >= the struct change of PR #42892): ``{"type": "BlockStored", ...}``, or
* legacy array-encoded: ``["BlockStored", block_hashes, parent, token_ids, block_size, ...]``.

Hashes are uint64 ints (vLLM's default) or the raw digest bytes, folded with
:func:`kvtier.collector.block_kinds.block_hash_from_bytes`. ``medium`` GPU/CPU/STORAGE maps to the
GPU/CPU/COLD tiers; a missing medium means GPU (older vLLM had no such field).

Mapping to the schema (one row of :class:`BlockEvent` fields per block hash; rows are dicts,
the store's fast path — ``EventBatch.from_rows`` validates them):

* ``BlockStored`` on GPU -> ``STORE`` into GPU (computed *or* loaded: vLLM does not say);
  on CPU -> ``STORE`` GPU->CPU (a promotion from a secondary tier looks the same);
  on STORAGE -> ``STORE`` CPU->COLD.
* ``BlockRemoved`` -> ``EVICT`` from that tier.
* ``AllBlocksCleared`` carries no hashes; it is reported as ``DecodedBatch.cleared`` and
  the tap turns it into evictions of the blocks it knows are resident.

Anything malformed raises :class:`FrameError`; the caller counts it and moves on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvtier.collector.block_kinds import UINT64_MAX, Outcome, Tier, block_hash_from_bytes

SEQ_BYTES = 8
#: The replay server's end-of-replay marker: seq -1 as a signed 8-byte int, empty payload.
END_OF_REPLAY_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)

#: Field order of the legacy array-encoded events (vLLM before PR #42892).
LEGACY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}

# medium -> (tier the block is stored into, tier it came from)
_STORE_TIERS = {Tier.GPU: (Tier.GPU, None), Tier.CPU: (Tier.CPU, Tier.GPU),
                Tier.COLD: (Tier.COLD, Tier.CPU)}


class FrameError(ValueError):
    """A frame or payload that does not follow the wire format."""


class Frame(NamedTuple):  # a tuple, not a frozen dataclass: one is built per frame
    """One live or replayed message: topic, publisher sequence number, raw payload."""

    topic: bytes
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """The block events of one vLLM ``KVEventBatch``, as rows of ``BlockEvent`` fields.

    ``cleared`` lists the tiers an ``AllBlocksCleared`` emptied, in order of appearance,
    each with the index into ``events`` where it happened. ``bad_events`` counts events
    inside the batch that were skipped as malformed.
    """

    ts_s: float
    dp_rank: int | None
    events: tuple[dict, ...]
    cleared: tuple[tuple[int, Tier], ...] = ()
    bad_events: int = 0


def split_frame(parts: list[bytes]) -> Frame:
    """``[topic, seq, payload]`` (or ``[seq, payload]``) -> :class:`Frame`."""
    if len(parts) == 3:
        topic, seq_bytes, payload = parts
    elif len(parts) == 2:
        topic, (seq_bytes, payload) = b"", parts
    else:
        raise FrameError(f"expected 3 frames [topic, seq, payload], got {len(parts)}")
    if type(topic) is not bytes or type(seq_bytes) is not bytes or type(payload) is not bytes:
        topic, seq_bytes, payload = bytes(topic), bytes(seq_bytes), bytes(payload)
    if len(seq_bytes) != SEQ_BYTES:
        raise FrameError(f"sequence frame must be {SEQ_BYTES} bytes, got {len(seq_bytes)}")
    return Frame(topic, int.from_bytes(seq_bytes, "big", signed=True), payload)


def decode_payload(payload: bytes, *, max_bytes: int = 64 << 20) -> DecodedBatch:
    """msgpack ``[ts, events, dp_rank?]`` -> :class:`DecodedBatch`; :class:`FrameError` if bad."""
    import msgpack  # optional at import time: kvtier --help must not pay for it

    if len(payload) > max_bytes:
        raise FrameError(f"payload of {len(payload)} bytes exceeds max_bytes={max_bytes}")
    try:  # msgpack bounds every container by the payload's own length
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise FrameError(f"payload is not msgpack: {exc.__class__.__name__}") from None
    if not isinstance(obj, (list, tuple)) or len(obj) not in (2, 3):
        raise FrameError("payload must be a msgpack array [ts, events, dp_rank?]")
    ts, events = obj[0], obj[1]
    dp_rank = obj[2] if len(obj) == 3 else None
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not ts >= 0:
        raise FrameError(f"batch ts must be a non-negative number, got {ts!r}")
    if not isinstance(events, (list, tuple)):
        raise FrameError("batch events must be an array")
    if dp_rank is not None and (isinstance(dp_rank, bool) or not isinstance(dp_rank, int)
                                or dp_rank < 0):
        raise FrameError(f"dp_rank must be a non-negative int or nil, got {dp_rank!r}")
    return _decode_events(float(ts), dp_rank, events)


def _decode_events(ts: float, dp_rank: int | None, raw_events) -> DecodedBatch:
    out: list[dict] = []
    cleared: list[tuple[int, Tier]] = []
    bad = 0
    for raw in raw_events:
        try:
            kind, fields = normalise_event(raw)
            if kind == "AllBlocksCleared":
                cleared.append((len(out), Tier.GPU))
            else:
                out.extend(_block_events(ts, kind, fields))
        except (FrameError, ValueError, TypeError):
            bad += 1
    return DecodedBatch(ts, dp_rank, tuple(out), tuple(cleared), bad)


def normalise_event(raw) -> tuple[str, dict]:
    """Either encoding -> ``(type name, {field: value})``; unknown keys are kept, ignored later."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    elif isinstance(raw, (list, tuple)) and raw:
        kind = raw[0]
        names = LEGACY_FIELDS.get(kind) if isinstance(kind, str) else None
        if names is None:
            raise FrameError(f"unknown legacy event type {kind!r}")
        fields = dict(zip(names, raw[1:]))
    else:
        raise FrameError("event must be a map or a tagged array")
    if kind not in LEGACY_FIELDS:
        raise FrameError(f"unknown event type {kind!r}; known: {', '.join(LEGACY_FIELDS)}")
    return kind, fields


def _block_events(ts: float, kind: str, fields: dict) -> list[dict]:
    hashes = [to_block_hash(h) for h in _list(fields.get("block_hashes"), "block_hashes")]
    tier = medium_to_tier(fields.get("medium"))
    if kind == "BlockRemoved":
        return [{"time_s": ts, "kind": Outcome.EVICT, "block_hash": h, "tier_from": tier}
                for h in hashes]
    block_size = fields.get("block_size")
    tokens = block_size if isinstance(block_size, int) and block_size > 0 else None
    parent_raw = fields.get("parent_block_hash")
    parent = None if parent_raw is None else to_block_hash(parent_raw)
    tier_to, tier_from = _STORE_TIERS[tier]
    out = []
    for h in hashes:
        out.append({"time_s": ts, "kind": Outcome.STORE, "block_hash": h, "parent_hash": parent,
                    "tokens": tokens, "tier_from": tier_from, "tier_to": tier_to})
        parent = h  # the hashes of one BlockStored are a chain
    return out


def _list(value, name: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise FrameError(f"{name} must be an array, got {type(value).__name__}")
    return list(value)


def to_block_hash(value) -> int:
    """A wire hash (uint64 int, or digest bytes) -> the schema's uint64."""
    if isinstance(value, bool):
        raise FrameError("a block hash cannot be a boolean")
    if isinstance(value, int):
        return value & UINT64_MAX  # signed hashes (old vLLM's builtin hash) fold to uint64
    if isinstance(value, (bytes, bytearray)) and value:
        return block_hash_from_bytes(bytes(value))
    raise FrameError(f"block hash must be an int or non-empty bytes, got {type(value).__name__}")


def medium_to_tier(medium) -> Tier:
    """vLLM ``medium`` -> tier. ``None`` is GPU; LMCache's lower-case ``"cpu"`` is accepted."""
    if medium is None:
        return Tier.GPU
    if not isinstance(medium, str):
        raise FrameError(f"medium must be a string, got {type(medium).__name__}")
    name = medium.upper()
    if name.startswith("GPU"):
        return Tier.GPU
    if name.startswith("CPU"):
        return Tier.CPU
    if name in ("STORAGE", "DISK"):
        return Tier.COLD
    raise FrameError(f"unknown medium {medium!r}; known: GPU, CPU, STORAGE")


def decoded_columns(decoded: DecodedBatch):
    """The general decoder's rows as the columns :class:`FrameColumns.add_rows` takes
    (``probes/vllm/wire_columns.pyx``), with the clear positions and the rows the schema
    would refuse (a ``block_size`` that is a bool or beyond INTEGER) left out and counted."""
    import numpy as np

    from kvtier.collector.columns import Rejections

    rejected = Rejections()
    kept, clears, at = [], [], dict(decoded.cleared)
    for i, row in enumerate(decoded.events + (None,)):
        if i in at:
            clears.append(len(kept))
        if row is None:
            break
        tokens = row.get("tokens")
        if tokens is not None and (isinstance(tokens, bool) or not tokens < 2**31):
            rejected.add("wrong type for tokens", example=tokens)
            continue
        kept.append(row)

    def column(name, dtype, absent):
        values = [row.get(name) for row in kept]
        return np.array([absent if v is None else int(v) if dtype != np.float64 else v
                         for v in values], dtype)

    parents = [row.get("parent_hash") for row in kept]
    values = {"time_s": column("time_s", np.float64, 0.0), "kind": column("kind", np.int8, 0),
              "block_hash": column("block_hash", np.uint64, 0),
              "parent_hash": np.array([p or 0 for p in parents], np.uint64),
              "parent_null": np.array([p is None for p in parents], np.uint8),
              "tokens": column("tokens", np.int32, -1),
              "tier_from": column("tier_from", np.int8, -1), "tier_to": column("tier_to", np.int8, -1)}
    return values, clears, rejected
