"""The message an engine process ships to the collector: one drained recorder batch.

Three to five ZMQ frames, standard library only on both ends (a vLLM install has pyzmq and
numpy, but not msgpack or pyarrow):

1. header, JSON: ``format`` (:data:`FORMAT`), ``engine``, ``instance``, ``source``,
   ``sequence`` (per source, from 0; the store's ledger ingests each ``(source, sequence)``
   once), ``first_event`` (block events the source sent before this batch: a jump means
   batches were lost on the way), ``events``, ``requests``, ``rejected_calls``,
   ``dropped_events_total`` / ``dropped_requests_total`` / ``dropped_steps_total``
   (cumulative drops of the source: recorder buffer full, or a batch that could not be sent;
   carried by every later batch), ``sent_s``, ``request_names``, and with step records
   ``steps`` and ``step_fields`` (the schema's ``StepRecord`` field names, in the order of
   the fourth frame's values);
2. the packed block-event records (``collector/record_layout.py``), ``events`` × 64 bytes;
3. the request records, JSON: a list of objects with the schema's field names, ``None``
   fields left out;
4. only when the batch holds step records (or tier moves): the step records, JSON, a list of
   value lists in ``step_fields`` order. A message without it carries none (an engine of an
   older kvtier);
5. only when the batch holds tier moves: the moves, JSON, a list of value lists in the
   header's ``move_fields`` order (the schema's ``TierMove`` field names), their count
   ``moves``.

The header's ``guardrail_rejected`` (an object, reason -> count; absent when empty) is the
source's cumulative count of control messages its engine dropped.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from kvtier.collector.events import Origin, RequestRecord
from kvtier.collector.packed_batch import MOVE_FIELDS, STEP_FIELDS, PackedBatch
from kvtier.collector.record_layout import RECORD_BYTES

FORMAT = "kvtier.hooks/1"
_COUNTERS = ("sequence", "first_event", "dropped_events_total", "dropped_requests_total")
_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(RequestRecord))


class ShipmentError(ValueError):
    """A message that is not a kvtier hooks shipment (one line: what is wrong)."""


@dataclass(frozen=True)
class Shipment:
    """One batch with its stream position and the source's cumulative drop counters."""

    packed: PackedBatch
    sequence: int
    first_event: int
    dropped_events_total: int = 0
    dropped_requests_total: int = 0
    sent_s: float = 0.0
    dropped_steps_total: int = 0

    def __post_init__(self) -> None:
        for name in _COUNTERS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise ShipmentError(f"{name} must be an int in 0..2**63-1, got {value!r}")
        if not isinstance(self.dropped_steps_total, int) or self.dropped_steps_total < 0:
            raise ShipmentError(f"dropped_steps_total must be an int >= 0, "
                                f"got {self.dropped_steps_total!r}")


def encode(shipment: Shipment) -> list[bytes]:
    """The frames of ``shipment``: three, and a fourth when it holds step records."""
    packed = shipment.packed
    origin = packed.origin
    header = {
        "format": FORMAT, "engine": origin.engine, "instance": origin.instance,
        "source": origin.source, "sequence": shipment.sequence,
        "first_event": shipment.first_event, "events": packed.num_events,
        "requests": len(packed.requests), "rejected_calls": packed.rejected_calls,
        "dropped_events_total": shipment.dropped_events_total,
        "dropped_requests_total": shipment.dropped_requests_total,
        "sent_s": shipment.sent_s, "request_names": list(packed.request_names),
        "dropped_steps_total": shipment.dropped_steps_total,
    }
    if packed.guardrail_rejected:
        header["guardrail_rejected"] = dict(packed.guardrail_rejected)
    requests = [_request_fields(r) for r in packed.requests]
    frames = [_json(header), packed.records, _json(requests)]
    if not packed.steps and not packed.moves:
        return frames
    header.update(steps=len(packed.steps), step_fields=list(STEP_FIELDS))
    frames += [_json([list(s) for s in packed.steps])]
    if packed.moves:
        header.update(moves=len(packed.moves), move_fields=list(MOVE_FIELDS))
        frames += [_json([list(m) for m in packed.moves])]
    frames[0] = _json(header)
    return frames


def decode(frames) -> Shipment:
    """Parse three to five frames; ``ShipmentError`` naming what is wrong otherwise."""
    if len(frames) not in (3, 4, 5):
        raise ShipmentError(f"expected 3 to 5 frames (header, records, requests[, steps[, "
                            f"moves]]), got {len(frames)}")
    header = _load(frames[0], "header")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise ShipmentError(f"not a {FORMAT} message (format {got!r})")
    records = bytes(frames[1])
    if len(records) % RECORD_BYTES or len(records) // RECORD_BYTES != header.get("events"):
        raise ShipmentError(f"records frame of {len(records)} bytes does not hold "
                            f"{header.get('events')!r} records of {RECORD_BYTES} bytes")
    requests = _load(frames[2], "requests")
    if not isinstance(requests, list) or len(requests) != header.get("requests"):
        raise ShipmentError(f"requests frame does not hold {header.get('requests')!r} records")
    names = header.get("request_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ShipmentError("request_names must be a list of strings")
    steps = _rows(frames[3], header, "steps", "step_fields", STEP_FIELDS) if len(frames) > 3 else ()
    moves = _rows(frames[4], header, "moves", "move_fields", MOVE_FIELDS) if len(frames) > 4 else ()
    try:
        origin = Origin(header.get("engine"), header.get("instance"), header.get("source"))
        packed = PackedBatch(origin, records, tuple(names), tuple(requests),
                             _int(header, "rejected_calls"), steps, moves,
                             _counts(header.get("guardrail_rejected")))
        return Shipment(packed, **{name: _int(header, name) for name in _COUNTERS},
                        sent_s=float(header.get("sent_s") or 0.0),
                        dropped_steps_total=_int({"dropped_steps_total": 0, **header},
                                                 "dropped_steps_total"))
    except (TypeError, ValueError) as error:
        raise ShipmentError(str(error)) from None


def _rows(frame, header: dict, what: str, fields_key: str, schema: tuple[str, ...]) -> tuple:
    """The rows of the steps or moves frame, each in this kvtier's ``schema`` order (a
    sender's field the schema lacks is dropped; one it lacks is ``None``, then validated)."""
    rows = _load(frame, what)
    fields = header.get(fields_key)
    if not isinstance(rows, list) or len(rows) != header.get(what):
        raise ShipmentError(f"{what} frame does not hold {header.get(what)!r} records")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise ShipmentError(f"{fields_key} must be a list of strings")
    if fields == list(schema):
        return tuple(rows)
    out = []
    for row in rows:
        values = dict(zip(fields, row)) if isinstance(row, list) else {}
        out.append(tuple(values.get(name) for name in schema))
    return tuple(out)


def _counts(value) -> tuple[tuple[str, int], ...]:
    """The header's ``guardrail_rejected`` (reason -> count), wrong entries left out."""
    if not isinstance(value, dict):
        return ()
    return tuple(sorted((k, v) for k, v in value.items() if isinstance(k, str)
                        and isinstance(v, int) and not isinstance(v, bool) and v >= 0))


def _request_fields(record) -> dict:
    if isinstance(record, dict):
        return record
    out = {}
    for name in _REQUEST_FIELDS:
        value = getattr(record, name)
        if value is not None:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _load(frame, what: str):
    try:
        return json.loads(bytes(frame))
    except (ValueError, UnicodeDecodeError) as error:
        raise ShipmentError(f"{what} frame is not JSON ({error})") from None


def _int(header: dict, name: str) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShipmentError(f"{name} must be an int, got {value!r}")
    return value
