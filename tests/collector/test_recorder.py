"""The recorder: bounded, never raises, drains whole records, survives concurrent appends."""

from __future__ import annotations

import threading

import pytest

from kvtier.collector.events import Outcome, RequestRecord, Tier
from kvtier.collector.recorder import Recorder, _RequestKeys


def test_recorded_fields_come_back_with_nulls_where_none_was_given(origin, clock):
    recorder = Recorder(origin, clock=clock)
    recorder.record(Outcome.CPU_PROMOTION, 2**64 - 1, "req-1", 7, 3, 16, 4096, Tier.CPU, Tier.GPU, 35, 0.004)
    recorder.record(Outcome.EVICT, 9, tier_from=Tier.CPU, time_s=12.5)
    batch = recorder.take_events()
    assert batch.sequence == 0 and not batch.rejected
    rows = batch.block_events.to_pylist()
    assert rows[0] == {"time_s": clock.now_s, "kind": "cpu_promotion", "block_hash": 2**64 - 1,
                       "request_id": "req-1", "parent_hash": 7, "position": 3, "tokens": 16,
                       "size_bytes": 4096, "tier_from": "cpu", "tier_to": "gpu", "priority": 35,
                       "latency_s": 0.004}
    assert rows[1] == {"time_s": 12.5, "kind": "evict", "block_hash": 9, "request_id": None,
                       "parent_hash": None, "position": None, "tokens": None, "size_bytes": None,
                       "tier_from": "cpu", "tier_to": None, "priority": None, "latency_s": None}


def test_full_buffer_drops_and_counts_then_recovers_after_a_drain(origin):
    recorder = Recorder(origin, capacity_events=3)
    for i in range(5):
        recorder.record(Outcome.GPU_HIT, i)
    assert recorder.dropped_events == 2
    assert recorder.take_events().block_events.column("block_hash").to_pylist() == [0, 1, 2]
    recorder.record(Outcome.GPU_HIT, 99)
    assert recorder.take_events().block_events.column("block_hash").to_pylist() == [99]
    assert recorder.dropped_events == 2


def test_request_buffer_is_bounded_too(origin):
    recorder = Recorder(origin, capacity_requests=2)
    for i in range(3):
        recorder.record_request(RequestRecord(f"r{i}", float(i), 10))
    assert recorder.dropped_requests == 1
    assert recorder.take_events().requests.column("request_id").to_pylist() == ["r0", "r1"]


def test_bad_calls_never_raise_and_are_counted_at_the_next_drain(origin):
    recorder = Recorder(origin)
    recorder.record(Outcome.GPU_HIT, "not-a-hash")
    recorder.record(Outcome.GPU_HIT, 1, request_id=12345)
    recorder.record(Outcome.GPU_HIT, 2, tier_from=7)
    recorder.record(Outcome.GPU_HIT, 3, latency_s=float("nan"))
    recorder.record(Outcome.GPU_HIT, 4, priority=250)
    recorder.record(Outcome.GPU_HIT, 5)
    batch = recorder.take_events()
    assert dict(batch.rejected) == {
        "wrong type in record() call": 2, "unknown tier code in tier_from": 1,
        "negative or NaN latency_s": 1, "priority outside 0..100": 1,
    }
    assert batch.block_events.column("block_hash").to_pylist() == [5]


def test_nothing_pending_gives_none_and_sequences_increase(origin):
    recorder = Recorder(origin, first_sequence=41)
    assert recorder.take_events() is None
    recorder.record(Outcome.STORE, 1)
    recorder.record_request(RequestRecord("r", 0.0, 1))
    assert recorder.take_events().sequence == 41
    recorder.record(Outcome.STORE, 2)
    assert recorder.take_events().sequence == 42


def test_concurrent_appends_while_draining_lose_or_corrupt_nothing(origin):
    recorder = Recorder(origin, capacity_events=1 << 20)
    threads, per_thread = 4, 20_000
    drained = []
    done = threading.Event()

    def produce(t):
        for i in range(per_thread):
            recorder.record(Outcome.GPU_HIT, t << 32 | i, f"t{t}", None, i, 16)

    def drain():
        while not done.is_set():
            batch = recorder.take_events()
            if batch is not None:
                drained.append(batch.block_events)

    drainer = threading.Thread(target=drain)
    drainer.start()
    producers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for p in producers:
        p.start()
    for p in producers:
        p.join()
    done.set()
    drainer.join()
    last = recorder.take_events()
    if last is not None:
        drained.append(last.block_events)
    rows = [row for table in drained for row in table.to_pylist()]
    assert len(rows) == threads * per_thread
    for row in rows:  # every field of a record belongs to the same call
        thread, i = row["block_hash"] >> 32, row["block_hash"] & 0xFFFFFFFF
        assert row["request_id"] == f"t{thread}" and row["position"] == i
    assert len({row["block_hash"] for row in rows}) == threads * per_thread


def test_request_id_keys_survive_table_rotation():
    import numpy as np

    def names(packed_keys):
        local, table = keys.local(np.array(packed_keys, dtype=np.uint32))
        return [table[i] for i in local]

    keys = _RequestKeys(rotate_after=4)
    first = [keys.key(f"a{i}") for i in range(6)]
    assert names(first) == [f"a{i}" for i in range(6)]  # and rotates
    late = keys.key("a5")  # looked up before rotation in a racing thread? now a new-generation key
    straggler = first[5]   # an old-generation key packed after the rotation still decodes
    assert names([straggler, late]) == ["a5", "a5"]


def test_capacity_must_be_positive(origin):
    with pytest.raises(ValueError, match="capacities"):
        Recorder(origin, capacity_events=0)


def test_record_run_writes_the_bytes_record_writes_one_event_at_a_time(origin, clock):
    hashes = [1, 2**64 - 1, 0x0102030405060708]
    shared = dict(request_id="req-7", size_bytes=4096, tier_from=Tier.GPU, tier_to=Tier.CPU,
                  latency_s=0.25, time_s=12.5)
    one_by_one, run = Recorder(origin, clock=clock), Recorder(origin, clock=clock)
    for h in hashes:
        one_by_one.record(Outcome.STORE, h, **shared)
    assert run.record_run(Outcome.STORE, [h.to_bytes(8, "little") for h in hashes], **shared)
    assert bytes(run._buffer) == bytes(one_by_one._buffer)
    table = run.take_events().block_events
    assert table.column("block_hash").to_pylist() == hashes
    assert table.column("position").null_count == 3 and table.column("parent_hash").null_count == 3
    # nulls for the shared fields too
    bare = Recorder(origin, clock=clock)
    assert bare.record_run(Outcome.EVICT, [(5).to_bytes(8, "little")])
    row = bare.take_events().block_events.to_pylist()[0]
    assert row["request_id"] is None and row["tier_from"] is None and row["latency_s"] is None


def test_record_run_refuses_what_it_cannot_pack_and_drops_past_capacity(origin):
    recorder = Recorder(origin, capacity_events=4)
    assert not recorder.record_run(Outcome.STORE, [b"short"])           # not an 8-byte hash
    assert not recorder.record_run(Outcome.STORE, [bytes(8)], size_bytes="big")
    assert recorder.dropped_events == 0  # refused whole: neither buffered nor dropped
    assert recorder.record_run(Outcome.STORE, [bytes(8)] * 3)
    assert recorder.record_run(Outcome.STORE, [bytes(8)] * 3)           # one fits, two dropped
    assert recorder.dropped_events == 2
    assert recorder.record_run(Outcome.STORE, [bytes(8)])               # full: dropped
    assert recorder.dropped_events == 3
    assert recorder.take_events().block_events.num_rows == 4  # 3, then the one that fitted
