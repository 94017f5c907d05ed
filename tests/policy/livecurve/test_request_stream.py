"""Requests as the live curve replays them: in arrival order though they reach the collector
as they finish, with their blocks from the record or, without them, from the source's lookup
events (the rule the store's reader follows)."""

from __future__ import annotations

import numpy as np

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord, Tier
from kvtier.collector.reader import StoreReader
from kvtier.policy.livecurve.request_stream import ArrivalOrder, LookupBuffer, requests_of

ORIGIN = Origin("sglang", "node-1", "zmq-sglang:node-1")


def record(rid: str, arrival: float, hashes=(), prompt=40, **split) -> RequestRecord:
    return RequestRecord(rid, arrival, prompt, block_hashes=tuple(hashes), block_size_tokens=16,
                         **split)


def lookup(rid: str, position: int, block: int, kind=Outcome.GPU_HIT) -> BlockEvent:
    return BlockEvent(100.0 + position, kind, block, request_id=rid, position=position, tokens=16,
                      tier_to=Tier.GPU)


def test_a_record_without_hashes_takes_its_lookups_as_the_reader_does(store):
    first = EventBatch.from_rows(ORIGIN, 0, block_events=[
        lookup("a", 1, 22), lookup("a", 0, 11), lookup("a", 2, 33, Outcome.RECOMPUTE_MISS),
        lookup("b", 0, 11), BlockEvent(1.0, Outcome.STORE, 44, tier_from=Tier.GPU, tier_to=Tier.CPU)])
    second = EventBatch.from_rows(ORIGIN, 1, requests=[record("a", 1.0), record("b", 2.0)])
    buffer = LookupBuffer()
    got = [requests_of(first, buffer), requests_of(second, buffer)]
    assert len(got[0]) == 0 and len(got[1]) == 2
    assert got[1].hashes.tolist() == [11, 22, 33, 11]
    assert np.diff(got[1].offsets).tolist() == [3, 1]
    for batch in (first, second):
        store.ingest(batch)
    replayed = [r.block_hashes for r in StoreReader(store).requests()]
    assert replayed == [(11, 22, 33), (11,)]  # the store's reader sees the same prompts


def test_records_with_hashes_are_taken_whole_and_their_lookups_not_kept():
    buffer = LookupBuffer()
    batch = EventBatch.from_rows(ORIGIN, 0, block_events=[lookup("x", 0, 5)],
                                 requests=[record("x", 1.0, (5, 6), gpu_hit_tokens=16,
                                                  recomputed_tokens=24)])
    got = requests_of(batch, buffer)
    assert got.hashes.tolist() == [5, 6] and got.split.tolist() == [[16, -1, -1, 24]]
    later = EventBatch.from_rows(ORIGIN, 1, block_events=[lookup("y", 0, 7)])
    requests_of(later, buffer)
    assert buffer.take(ORIGIN.source, "y").size == 0  # this source's records carry hashes


def test_requests_are_released_in_arrival_order_once_later_ones_arrived():
    order, buffer = ArrivalOrder(reorder_s=10.0), LookupBuffer()

    def batch(seq, *records):
        return requests_of(EventBatch.from_rows(ORIGIN, seq, requests=records), buffer)

    order.add(batch(0, record("late", 5.0, (1,)), record("early", 1.0, (2,))), now_s=0.0)
    assert len(order.release()) == 0  # nothing is 10 s older than the newest arrival yet
    order.add(batch(1, record("next", 13.0, (3,)), record("last", 30.0, (4,))), now_s=1.0)
    first = order.release()
    assert first.arrival_s.tolist() == [1.0, 5.0, 13.0] and first.hashes.tolist() == [2, 1, 3]
    assert len(order) == 1
    assert len(order.release(now_s=5.0)) == 0  # not quiet for 10 s yet
    assert order.release(now_s=11.0).hashes.tolist() == [4]  # quiet: everything goes
    assert len(order) == 0
