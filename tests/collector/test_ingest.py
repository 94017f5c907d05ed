"""Idempotent, atomic, validating ingest; retention by age."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord, Tier


def lookups(n, start_s=1_800_000_000.0, request_id="r"):
    return [BlockEvent(start_s + i, Outcome.GPU_HIT, 1000 + i, request_id=request_id, position=i,
                       tokens=16, tier_to=Tier.GPU, latency_s=0.0) for i in range(n)]


def test_replayed_batch_is_stored_once(store, origin):
    batch = EventBatch.from_rows(origin, 7, lookups(5), [RequestRecord("r", 1.0, 80)])
    first = store.ingest(batch)
    again = store.ingest(batch)
    assert (first.block_events, first.requests, first.duplicate) == (5, 1, False)
    assert again.duplicate and again.stored == 0
    assert store.count("block_events") == 5
    assert store.count("requests") == 1
    assert store.count("ingested_batches") == 1


def test_same_sequence_from_another_source_is_a_different_batch(store, origin):
    other = Origin(origin.engine, origin.instance, origin.source + "-restarted")
    store.ingest(EventBatch.from_rows(origin, 0, lookups(3)))
    result = store.ingest(EventBatch.from_rows(other, 0, lookups(3)))
    assert not result.duplicate
    assert store.count("block_events") == 6


def test_malformed_rows_are_counted_logged_and_the_rest_stored(store, origin, caplog):
    rows = [
        *lookups(3),
        {"time_s": 1.0, "kind": "gpu_hit", "block_hash": "not-a-hash"},
        {"time_s": 1.0, "kind": "cpu_promotion", "block_hash": 5, "latency_s": -0.002},
        {"time_s": 1.0, "kind": "evict", "block_hash": 6, "tier_from": "nvme"},
        {"time_s": 1.0, "kind": "teleport", "block_hash": 7},
        {"time_s": 1.0, "kind": "store", "block_hash": 8, "tier_from": "gpu", "tier_to": "cpu"},
    ]
    with caplog.at_level(logging.WARNING, logger="kvtier.collector.columns"):
        batch = EventBatch.from_rows(origin, 0, rows)
    result = store.ingest(batch)
    assert result.block_events == 4
    assert dict(result.rejected) == {
        "wrong type for block_hash": 1, "negative or NaN latency_s": 1,
        "unknown tier": 1, "unknown outcome": 1,
    }
    assert "negative or NaN latency_s" in caplog.text and "-0.002" in caplog.text
    assert store.scalar("SELECT rejected FROM ingested_batches") == 4
    assert store.rejected_total["unknown tier"] == 1
    stored = store.query("SELECT block_hash FROM block_events ORDER BY block_hash").column(0).to_pylist()
    assert stored == [8, 1000, 1001, 1002]


def test_a_batch_that_fails_leaves_nothing_behind(store, origin):
    good = EventBatch.from_rows(origin, 3, lookups(4))
    broken = EventBatch(origin, 3, good.block_events.drop_columns(["latency_s"]), good.requests)
    with pytest.raises(ValueError, match="differ from the schema"):
        store.ingest(broken)
    assert store.count("block_events") == 0
    assert store.count("ingested_batches") == 0
    assert not store.ingest(good).duplicate
    assert store.count("block_events") == 4


def test_bad_input_does_not_touch_what_is_stored(store, origin):
    store.ingest(EventBatch.from_rows(origin, 0, lookups(2)))
    bad_requests = pa.table({"nonsense": [1]})
    with pytest.raises(ValueError):
        store.ingest(EventBatch(origin, 1, EventBatch.empty(origin, 1).block_events, bad_requests))
    assert store.count("block_events") == 2


def test_prune_removes_only_old_rows_and_keeps_the_ledger(store, origin, clock):
    old = clock.now_s - 10 * 86400
    store.ingest(EventBatch.from_rows(origin, 0, lookups(3, start_s=old), [RequestRecord("old", old, 10)]))
    store.ingest(EventBatch.from_rows(origin, 1, lookups(2, start_s=clock.now_s - 60),
                                      [RequestRecord("new", clock.now_s - 60, 10)]))
    result = store.prune(max_age_s=7 * 86400)
    assert (result.block_events, result.requests) == (3, 1)
    assert store.count("block_events") == 2
    assert store.query("SELECT request_id FROM requests").column(0).to_pylist() == ["new"]
    # A replay of the pruned batch is recognised, not stored again.
    replay = store.ingest(EventBatch.from_rows(origin, 0, lookups(3, start_s=old)))
    assert replay.duplicate
    assert store.count("block_events") == 2


def test_prune_rejects_a_negative_age(store):
    with pytest.raises(ValueError, match="max_age_s"):
        store.prune(-1)


def test_views_join_each_row_to_its_origin(store, origin):
    store.ingest(EventBatch.from_rows(origin, 9, lookups(2)))
    rows = store.query("SELECT DISTINCT engine, instance, source, sequence FROM block_events_with_origin").to_pylist()
    assert rows == [{"engine": origin.engine, "instance": origin.instance, "source": origin.source, "sequence": 9}]


def test_batch_sequence_must_be_a_non_negative_int(origin):
    with pytest.raises(ValueError, match="sequence"):
        EventBatch.from_rows(origin, -1, [])


def test_a_group_commit_stores_every_batch_once_or_none_of_them(store, origin):
    first, second = (EventBatch.from_rows(origin, s, lookups(3 + s, request_id=f"r{s}"),
                                          [RequestRecord(f"r{s}", 1.0, 64)]) for s in (0, 1))
    broken = EventBatch(origin, 2, first.block_events.drop_columns(["latency_s"]), first.requests)
    with pytest.raises(ValueError, match="differ from the schema"):
        store.ingest_many([first, second, broken])
    assert store.count("block_events") == 0 and store.count("ingested_batches") == 0
    results = store.ingest_many([first, second, first])  # the replay sees the group's own row
    assert [(r.sequence, r.block_events, r.duplicate) for r in results] == [
        (0, 3, False), (1, 4, False), (0, 0, True)]
    assert store.count("block_events") == 7
    # each row carries its own batch's id, though the group's rows went in with one insert
    assert store.query("SELECT b.sequence, count(*) AS n, any_value(e.request_id) AS rid "
                       "FROM block_events e JOIN ingested_batches b USING (batch_id) "
                       "GROUP BY b.sequence ORDER BY b.sequence").to_pylist() == [
        {"sequence": 0, "n": 3, "rid": "r0"}, {"sequence": 1, "n": 4, "rid": "r1"}]
    assert store.query("SELECT r.request_id, b.sequence FROM requests r JOIN ingested_batches b "
                       "USING (batch_id) ORDER BY b.sequence").to_pylist() == [
        {"request_id": "r0", "sequence": 0}, {"request_id": "r1", "sequence": 1}]
