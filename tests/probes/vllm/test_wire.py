"""The vLLM KV-event decoder: the documented byte example, both encodings, and fuzzed input."""

from __future__ import annotations

import random

import msgpack
import pytest

from kvtier.collector.events import Outcome, Tier
from kvtier.probes.vllm.wire import (
    DecodedBatch, FrameError, decode_payload, medium_to_tier, split_frame, to_block_hash,
)
from kvtier.probes.vllm.tap import VllmEventTap, VllmTapConfig

# Encoded with vLLM 0.33.0's own structs (msgspec), 230 bytes
H = bytes.fromhex("cf1122334455667788")
DOC_EXAMPLE = b"".join([
    bytes.fromhex("93cb41d954fc4020000093de0009"),
    b"\xa4type\xabBlockStored", b"\xacblock_hashes\x91" + H, b"\xb1parent_block_hash\xc0",
    b"\xa9token_ids\x94\x01\x02\x03\x04", b"\xaablock_size\x04", b"\xa7lora_id\xc0",
    b"\xa6medium\xa3GPU", b"\xa9lora_name\xc0", b"\xa9group_idx\x00",
    b"\x84\xa4type\xacBlockRemoved", b"\xacblock_hashes\x91" + H, b"\xa6medium\xa3CPU",
    b"\xa9group_idx\x00",
    b"\x81\xa4type\xb0AllBlocksCleared", b"\x00",
])


def test_the_documented_byte_example_decodes():
    assert len(DOC_EXAMPLE) == 230
    batch = decode_payload(DOC_EXAMPLE)
    assert batch.ts_s == 1700000000.5 and batch.dp_rank == 0
    stored, removed = batch.events
    assert (stored["kind"], stored["block_hash"], stored["tokens"], stored["tier_to"]) == (
        Outcome.STORE, 0x1122334455667788, 4, Tier.GPU)
    assert (removed["kind"], removed["tier_from"], removed.get("tier_to")) == (
        Outcome.EVICT, Tier.CPU, None)
    assert batch.cleared == ((2, Tier.GPU),)


def test_missing_dp_rank_and_placeholder_offload_events():
    body = msgpack.packb([5.0, [{"type": "BlockStored", "block_hashes": [9],
                                 "parent_block_hash": None, "token_ids": [], "block_size": 0,
                                 "lora_id": None, "medium": "CPU", "lora_name": None}]])
    batch = decode_payload(body)
    assert batch.dp_rank is None
    (event,) = batch.events
    assert event["tokens"] is None  # vLLM's placeholder offload events carry block_size 0


@pytest.mark.parametrize("value, expected", [
    (7, 7), (2**64 - 1, 2**64 - 1), (-1, 2**64 - 1),
    (bytes(24) + (5).to_bytes(8, "big"), 5)])
def test_hash_forms(value, expected):
    assert to_block_hash(value) == expected


@pytest.mark.parametrize("bad", [True, None, 1.5, b"", "abc"])
def test_bad_hashes_are_frame_errors(bad):
    with pytest.raises(FrameError):
        to_block_hash(bad)


def test_medium_names():
    assert [medium_to_tier(m) for m in (None, "GPU", "cpu", "STORAGE", "CPU_TIER1")] == [
        Tier.GPU, Tier.GPU, Tier.CPU, Tier.COLD, Tier.CPU]
    with pytest.raises(FrameError, match="unknown medium"):
        medium_to_tier("TAPE")


def test_split_frame_shapes():
    assert split_frame([b"t", (3).to_bytes(8, "big"), b"p"]).seq == 3
    assert split_frame([(3).to_bytes(8, "big"), b"p"]).topic == b""
    assert split_frame([b"", b"\xff" * 8, b""]).seq == -1  # the end of a replay
    with pytest.raises(FrameError):
        split_frame([b"t", b"123", b"p"])


WRONG_SHAPES = [
    [], [1.0], [1.0, [], 0, "extra"], ["ts", []], [-1.0, []], [1.0, "events"], [1.0, [], -2],
    [1.0, [], True], {"ts": 1.0}, "text", None, 3,
]


@pytest.mark.parametrize("shape", WRONG_SHAPES)
def test_wrong_envelopes_are_frame_errors(shape):
    with pytest.raises(FrameError):
        decode_payload(msgpack.packb(shape))


def test_wrong_events_are_skipped_and_counted():
    events = [{"type": "BlockStored"}, {"type": "BlockRemoved", "block_hashes": "x"},
              ["Unknown", 1], [], 42, {"type": "BlockRemoved", "block_hashes": [1],
                                       "medium": "GPU", "new_field_from_the_future": 1}]
    batch = decode_payload(msgpack.packb([1.0, events, 0]))
    assert batch.bad_events == 5 and [e["block_hash"] for e in batch.events] == [1]


def test_fuzzed_payloads_never_raise_anything_but_frame_error():
    rng = random.Random(4)
    good = DOC_EXAMPLE
    samples = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(64))) for _ in range(300)]
    samples += [good[:cut] for cut in range(len(good))]  # every truncation
    samples += [bytes(b ^ (1 << rng.randrange(8)) if rng.random() < 0.05 else b for b in good)
                for _ in range(300)]  # bit flips
    for sample in samples:
        try:
            assert isinstance(decode_payload(sample), DecodedBatch)
        except FrameError:
            pass


def test_huge_lists_are_bounded_by_the_size_limit():
    body = msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": list(range(50_000)),
                                 "medium": "GPU"}], 0])
    assert len(decode_payload(body).events) == 50_000
    with pytest.raises(FrameError, match="exceeds"):
        decode_payload(body, max_bytes=1024)
    # a header that claims 2**32 elements is rejected without allocating them
    with pytest.raises(FrameError):
        decode_payload(b"\x93\xcb" + bytes(8) + b"\xdd\xff\xff\xff\xff")


def test_the_tap_survives_fuzzed_frames_and_keeps_good_ones():
    batches = []
    tap = VllmEventTap(VllmTapConfig(), batches.append)
    rng = random.Random(7)
    for i in range(200):
        parts = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(12)))
                 for _ in range(rng.randrange(5))]
        tap._on_live(parts)
    tap._on_live([b"", (0).to_bytes(8, "big"), DOC_EXAMPLE])
    assert len(batches) == 1 and tap.stats.bad_frames >= 190
