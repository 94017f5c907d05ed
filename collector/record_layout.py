"""The packed block-event record: 64 bytes, fixed width, what the recorder buffers.

The recorder packs each event with :data:`RECORD` and the drain views the bytes as a numpy
structured array of :data:`DTYPE`, column by column. The same bytes travel from an engine
process to the collector (``collector/shipment.py``), so this layout is also a wire format:
change it only with a new shipment format version.

``nulls`` has bit ``NULL_BIT[name]`` set when the optional field ``name`` was ``None``.
``request_key`` indexes the request-id names that travel beside the records. Standard library
and numpy only: an engine process imports it.
"""

from __future__ import annotations

import struct

import numpy as np

RECORD = struct.Struct("<dQQdqIiiHbbbh5x")
RECORD_BYTES = RECORD.size  # 64
DTYPE = np.dtype([
    ("time_s", "<f8"), ("block_hash", "<u8"), ("parent_hash", "<u8"), ("latency_s", "<f8"),
    ("size_bytes", "<i8"), ("request_key", "<u4"), ("position", "<i4"), ("tokens", "<i4"),
    ("nulls", "<u2"), ("kind", "i1"), ("tier_from", "i1"), ("tier_to", "i1"), ("priority", "<i2"),
    ("_pad", "V5"),
])
OPTIONAL = ("request_id", "parent_hash", "position", "tokens", "size_bytes", "tier_from",
            "tier_to", "priority", "latency_s")
NULL_BIT = {name: 1 << i for i, name in enumerate(OPTIONAL)}
HASH_AT = 8  # block_hash follows time_s
# Runs (one engine call's events) never carry a parent, position or priority.
RUN_NULLS = NULL_BIT["parent_hash"] | NULL_BIT["position"] | NULL_BIT["priority"]
