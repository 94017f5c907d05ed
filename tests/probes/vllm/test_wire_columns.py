"""The compiled walker (probes/vllm/wire_columns.pyx) against the general decoder
(probes/vllm/wire.py, the oracle): every frame it decodes gives the same rows; every frame it
is not sure of it leaves alone; residency gives what the plain-Python rule gives."""

from __future__ import annotations

import random

import msgpack
import numpy as np
import pytest

from kvtier.collector.events import Outcome, Tier
from kvtier.probes.vllm import wire_columns
from kvtier.probes.vllm.wire import LEGACY_FIELDS, FrameError, decode_payload
from tests.probes.vllm.reference_residency import apply_residency
from tests.probes.vllm.test_wire import DOC_EXAMPLE

COLUMNS = ("time_s", "kind", "block_hash", "parent_hash", "tokens", "tier_from", "tier_to")


def oracle_rows(rows: list[dict]) -> list[tuple]:
    return [(r["time_s"], int(r["kind"]), r["block_hash"], r.get("parent_hash"), r.get("tokens"),
             None if r.get("tier_from") is None else int(r["tier_from"]),
             None if r.get("tier_to") is None else int(r["tier_to"])) for r in rows]


def walker_rows(columns: dict) -> list[tuple]:
    out = []
    for i in range(len(columns["time_s"])):
        out.append((float(columns["time_s"][i]), int(columns["kind"][i]),
                    int(columns["block_hash"][i]),
                    None if columns["parent_null"][i] else int(columns["parent_hash"][i]),
                    None if columns["tokens"][i] < 0 else int(columns["tokens"][i]),
                    None if columns["tier_from"][i] < 0 else int(columns["tier_from"][i]),
                    None if columns["tier_to"][i] < 0 else int(columns["tier_to"][i])))
    return out


def walk(payload: bytes):
    frame = wire_columns.FrameColumns()
    answer = frame.add_payload(payload)
    return answer, frame


def random_hash(rng):
    return rng.choice([rng.randrange(2**64), rng.randrange(-2**63, 0), rng.randrange(300),
                       bytes(rng.randrange(256) for _ in range(rng.choice([32, 8, 3]))),
                       None, True, b"", "x", 1.5])


def random_event(rng):
    kind = rng.choice(["BlockStored"] * 4 + ["BlockRemoved"] * 3 + ["AllBlocksCleared", "Other"])
    hashes = [random_hash(rng) if rng.random() < 0.05 else rng.randrange(2**64)
              for _ in range(rng.randrange(0, 6))]
    medium = rng.choice(["GPU", "CPU", "STORAGE", None, "cpu", "gpu0", "DISK", "nvme", 3,
                         "GPÜ", "ſtorage"])
    if kind == "BlockStored":
        event = {"type": kind, "block_hashes": hashes,
                 "parent_block_hash": rng.choice([None, rng.randrange(2**64), random_hash(rng)]),
                 "token_ids": list(range(rng.randrange(70))),
                 "block_size": rng.choice([16, 0, -1, None, 2**40, True, 16.0, 64, 2**31 - 1]),
                 "lora_id": None, "medium": medium, "lora_name": rng.choice([None, "ad", "é"])}
        if rng.random() < 0.3:
            event.update(group_idx=0, extra_keys=[["x", 1], None], kv_cache_spec_kind="mla")
    elif kind == "BlockRemoved":
        event = {"type": kind, "block_hashes": hashes, "medium": medium}
    else:
        event = {"type": kind}
    if rng.random() < 0.1:
        event.pop(rng.choice(list(event)))
    if rng.random() < 0.2:  # the legacy array form, possibly cut short
        names = LEGACY_FIELDS.get(event.get("type"), ())
        event = [event.get("type")] + [event.get(n) for n in names][:rng.randrange(len(names) + 1)]
    return event


def random_payload(rng) -> bytes:
    body = [rng.choice([1.7e9, 0, 5, -1.0, float("nan"), True, 1.7e9 + 0.5, 2**64 - 1]),
            [random_event(rng) for _ in range(rng.randrange(6))]]
    if rng.random() < 0.8:
        body.append(rng.choice([0, 1, None, -1, 7, 2**63, "0"]))
    payload = msgpack.packb(body, use_single_float=rng.random() < 0.1)
    if rng.random() < 0.02:
        payload += b"\x00"
    if rng.random() < 0.02:
        payload = payload[:-1]
    return payload


def assert_agrees(payload: bytes) -> str:
    """Walker vs oracle on one payload; returns what happened."""
    answer, frame = walk(payload)
    try:
        expected = decode_payload(payload)
    except FrameError:
        expected = None
    if answer == wire_columns.FALLBACK:
        assert len(frame) == 0  # a frame left to the general decoder leaves nothing behind
        return "fallback"
    assert expected is not None and expected.bad_events == 0, payload
    columns = frame.take()
    assert walker_rows(columns) == oracle_rows(expected.events)
    assert list(columns["clears"]) == [i for i, _ in expected.cleared]
    assert frame.ts_s == expected.ts_s
    assert (None if frame.dp_rank < 0 else frame.dp_rank) == expected.dp_rank
    return "decoded"


def test_codes_are_the_schemas():
    _, frame = walk(msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1],
                                          "parent_block_hash": None, "block_size": 16,
                                          "medium": "CPU"},
                                         {"type": "BlockRemoved", "block_hashes": [2],
                                          "medium": "STORAGE"}], 0]))
    columns = frame.take()
    assert list(columns["kind"]) == [Outcome.STORE, Outcome.EVICT]
    assert list(columns["tier_from"]) == [Tier.GPU, Tier.COLD]
    assert list(columns["tier_to"]) == [Tier.CPU, -1]


def test_random_payloads_agree_with_the_general_decoder():
    rng = random.Random(11)
    seen = {"decoded": 0, "fallback": 0}
    for _ in range(6000):
        seen[assert_agrees(random_payload(rng))] += 1
    assert seen["decoded"] > 500 and seen["fallback"] > 500  # both paths were exercised


def test_truncations_and_bit_flips_of_the_documented_example():
    assert assert_agrees(DOC_EXAMPLE) == "decoded"
    rng = random.Random(3)
    for cut in range(len(DOC_EXAMPLE)):
        assert_agrees(DOC_EXAMPLE[:cut])
    for _ in range(2000):
        assert_agrees(bytes(b ^ (1 << rng.randrange(8)) if rng.random() < 0.05 else b
                            for b in DOC_EXAMPLE))


@pytest.mark.parametrize("event", [
    {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": 9, "token_ids": [1] * 32,
     "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": "adaptér", "group_idx": 0,
     "kv_cache_spec_kind": "full_attention", "extra_keys": [["img", 3], None]},
    {"type": "BlockStored", "block_hashes": [bytes(range(32))], "parent_block_hash": None,
     "token_ids": [], "block_size": 0, "lora_id": None, "medium": "CPU", "lora_name": None},
    {"type": "BlockRemoved", "block_hashes": [2**64 - 1], "medium": "STORAGE", "locality": "LOCAL"},
    ["BlockStored", [5], None, [1, 2], 2, None, "CPU", None],
    ["BlockRemoved", [5], "GPU"],
    {"type": "AllBlocksCleared"},
])
def test_the_shapes_vllm_sends_take_the_compiled_path(event):
    assert assert_agrees(msgpack.packb([1.7e9, [event, event], 0], use_bin_type=True)) == "decoded"


def test_a_header_claiming_billions_of_elements_is_left_alone_without_allocating():
    assert walk(b"\x93\xcb" + bytes(8) + b"\xdd\xff\xff\xff\xff")[0] == wire_columns.FALLBACK


def frames_with_clears(rng, n_frames: int, universe: int):
    for f in range(n_frames):
        events = []
        for _ in range(rng.randrange(1, 6)):
            r = rng.random()
            if r < 0.55:
                events.append({"type": "BlockStored", "medium": rng.choice(["GPU", "GPU", "CPU"]),
                               "block_hashes": [rng.randrange(universe) for _ in range(3)],
                               "parent_block_hash": None, "block_size": 16})
            elif r < 0.98:
                events.append({"type": "BlockRemoved", "medium": rng.choice(["GPU", "GPU", "CPU"]),
                               "block_hashes": [rng.randrange(universe)]})
            else:
                events.append({"type": "AllBlocksCleared"})
        yield msgpack.packb([float(f), events, 0])


@pytest.mark.parametrize("max_tracked", [1_000_000, 300])
def test_residency_matches_the_plain_python_rule(max_tracked):
    rng = random.Random(5)
    stream, frame = wire_columns.StreamColumns(), wire_columns.FrameColumns()
    resident, expected = set(), []
    for payload in frames_with_clears(rng, 4000, universe=5000):
        decoded = decode_payload(payload)
        expected += apply_residency(resident, decoded, max_tracked)
        if rng.random() < 0.5:  # the compiled walker, or the general decoder's rows
            assert frame.add_payload(payload) == wire_columns.DECODED
        else:
            from kvtier.probes.vllm.wire import decoded_columns

            values, clears, _ = decoded_columns(decoded)
            frame.add_rows(decoded.ts_s, *values.values(), clears=clears)
        stream.absorb(frame, max_tracked)
        assert len(frame) == 0
    assert stream.resident_blocks == len(resident) > 0
    assert all(stream.is_resident(h) for h in resident)
    assert not any(stream.is_resident(h) for h in set(range(5000)) - resident)
    got = stream.take()
    assert walker_rows(got)[:len(expected)] == [row[:3] + (row[3], row[4], row[5], row[6])
                                                for row in oracle_rows(expected)]
    assert len(got["time_s"]) == len(expected)


def test_residency_survives_growth_deletion_runs_and_the_zero_hash():
    stream, frame = wire_columns.StreamColumns(), wire_columns.FrameColumns()
    rng = np.random.default_rng(2)
    reference = set()
    for step in range(30):  # grows past 1024 slots and deletes inside long probe runs
        hashes = rng.integers(0, 40_000, 3000, dtype=np.uint64)
        hashes[:5] = 0
        store = rng.random(3000) < 0.6
        n = len(hashes)
        frame.add_rows(float(step), np.full(n, float(step)), np.where(store, 4, 5).astype(np.int8),
                       hashes, np.zeros(n, np.uint64), np.ones(n, np.uint8), np.full(n, 16, np.int32),
                       np.where(store, -1, 0).astype(np.int8), np.where(store, 0, -1).astype(np.int8))
        stream.absorb(frame, 1_000_000)
        for h, s in zip(hashes.tolist(), store.tolist()):
            (reference.add if s else reference.discard)(h)
        assert stream.resident_blocks == len(reference)
    assert all(stream.is_resident(h) for h in reference)
    assert sum(stream.is_resident(h) for h in range(40_000)) == len(reference)


def test_residency_at_the_growth_threshold_with_wrapping_probe_runs():
    # ~500 members in 1024 slots for 100k churns: probe runs wrap past the table's end often
    stream, frame = wire_columns.StreamColumns(), wire_columns.FrameColumns()
    rng = np.random.default_rng(9)
    pool = rng.integers(1, 2**64, 4000, dtype=np.uint64)
    members = list(pool[:500].tolist())
    hashes, store = list(members), [True] * 500
    for _ in range(100_000):
        out = members.pop(int(rng.integers(len(members))))
        new = int(pool[rng.integers(len(pool))])
        hashes += [out, new]
        store += [False, True]
        if new not in members:
            members.append(new)
    n = len(hashes)
    store = np.array(store)
    frame.add_rows(0.0, np.zeros(n), np.where(store, 4, 5).astype(np.int8),
                   np.array(hashes, np.uint64), np.zeros(n, np.uint64), np.ones(n, np.uint8),
                   np.full(n, 16, np.int32), np.where(store, -1, 0).astype(np.int8),
                   np.where(store, 0, -1).astype(np.int8))
    stream.absorb(frame, 1_000_000)
    reference = set()
    for h, s in zip(hashes, store.tolist()):
        (reference.add if s else reference.discard)(h)
    assert stream.resident_blocks == len(reference)
    assert [h for h in pool.tolist() if stream.is_resident(h)] == \
        [h for h in pool.tolist() if h in reference]


def test_the_tap_stores_the_same_batches_with_and_without_the_walker():
    from kvtier.probes.vllm.tap import VllmEventTap, VllmTapConfig

    rng = random.Random(8)
    payloads = [random_payload(rng) for _ in range(1500)]
    payloads += list(frames_with_clears(rng, 500, universe=400))
    got = {}
    for fast in (True, False):
        batches = []
        tap = VllmEventTap(VllmTapConfig(fast_decode=fast, coalesce_frames=True,
                                         max_rows_per_batch=700), batches.append,
                           clock=lambda: 1000.0)
        for seq, payload in enumerate(payloads):
            tap._on_live([b"", seq.to_bytes(8, "big"), payload])
        tap.flush()
        got[fast] = ([(b.origin.source, b.sequence, b.block_events.to_pylist(), dict(b.rejected))
                      for b in batches], tap.stats)
    assert got[True][0] == got[False][0] and len(got[True][0]) > 5
    fast, slow = got[True][1], got[False][1]
    assert 0 < fast.fallback_frames < slow.fallback_frames == slow.batches
    assert (fast.batches, fast.bad_frames, fast.bad_events, fast.block_events) == \
        (slow.batches, slow.bad_frames, slow.bad_events, slow.block_events)
