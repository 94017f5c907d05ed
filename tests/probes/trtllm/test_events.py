"""TensorRT-LLM /kv_cache_events: fixtures from the documented JSON (KVCacheEventSerializer,
commit ed53795, plus the V2 envelope keys), served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from kvtier.collector.events import Outcome, Tier
from kvtier.collector.store import TraceStore
from tests.probes.fake_http import FakeEngineHttp
from kvtier.probes.trtllm.events import (
    EventError, TrtllmEventMapper, TrtllmEventPoller, TrtllmPollerConfig, to_block_hash,
)

pytestmark = pytest.mark.timeout(20)

H1, H2 = 9622824665191806685, 1234

DRAIN_1 = [
    {"event_id": 0, "window_size": 4096, "data": {"type": "created",
                                                  "num_blocks_per_cache_level": [1000, 4000]}},
    {"event_id": 7, "window_size": 4096, "attention_dp_rank": 0,
     "data": {"type": "stored", "parent_hash": None, "blocks": [
         {"type": "stored_block", "block_hash": H1, "cache_level": 0, "priority": 35,
          "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0}
                     for t in range(32)]},
         {"type": "stored_block", "block_hash": H2, "cache_level": 0, "priority": 80,
          "tokens": [], "mm_keys": [], "cache_salt": None}]}},
]
DRAIN_2 = [
    {"event_id": 8, "window_size": 4096, "data": {
        "type": "updated", "block_hash": H1,
        "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0},
        "priority": {"type": "event_diff", "new_value": 20, "old_value": 35}}},
    {"event_id": 9, "window_size": 4096, "data": {"type": "removed", "block_hashes": [H1, H2]}},
    {"event_id": 10, "window_size": 4096, "hash_algo": "v2_sha256", "layer_group_id": 0,
     "data": {"type": "stored", "parent_hash": "11" * 32, "blocks": [
         {"type": "stored_block", "block_hash": "22" * 32, "cache_level": 1, "priority": 35,
          "tokens": [], "future_key": {"x": 1}}]}},
    {"event_id": 11, "window_size": 4096, "data": {
        "type": "updated", "block_hash": "22" * 32,
        "cache_level": {"type": "event_diff", "new_value": 0, "old_value": 1}}},
]


def table(events):
    return [(e.kind, e.block_hash, e.tier_from, e.tier_to, e.priority) for e in events]


def test_stored_updated_removed_map_to_the_schema():
    mapper = TrtllmEventMapper()
    first = mapper.map_events(DRAIN_1, 10.0)
    assert mapper.capacity_blocks == (1000, 4000)
    assert table(first) == [(Outcome.STORE, H1, None, Tier.GPU, 35),
                            (Outcome.STORE, H2, None, Tier.GPU, 80)]
    assert first[0].tokens == 32 and first[1].parent_hash == H1
    hex_hash = int("22" * 8, 16)
    assert table(mapper.map_events(DRAIN_2, 11.0)) == [
        (Outcome.STORE, H1, Tier.GPU, Tier.CPU, None),         # offload 0 -> 1
        (Outcome.PRIORITY_UPDATE, H1, None, None, 20),
        (Outcome.EVICT, H1, Tier.CPU, None, None),             # it was on the host by then
        (Outcome.EVICT, H2, Tier.GPU, None, None),
        (Outcome.STORE, hex_hash, None, Tier.CPU, 35),
        (Outcome.CPU_PROMOTION, hex_hash, Tier.CPU, Tier.GPU, None),  # onboard 1 -> 0
    ]
    assert mapper.bad_events == 0


@pytest.mark.parametrize("bad", [
    {"data": {"type": "teleported"}}, {"no_data": 1}, {"data": {"type": "removed"}},
    {"data": {"type": "removed", "block_hashes": [True]}},
    {"data": {"type": "stored", "blocks": [{"block_hash": 1, "cache_level": 7}]}},
    {"data": {"type": "stored", "blocks": [{"block_hash": 1, "priority": 101}]}},
    {"data": {"type": "updated", "block_hash": "zz"}}, "not a dict", None,
])
def test_malformed_events_are_counted_not_raised(bad):
    mapper = TrtllmEventMapper()
    assert mapper.map_events([bad, DRAIN_1[1]], 1.0)[0].block_hash == H1
    assert mapper.bad_events == 1


def test_hash_forms():
    assert to_block_hash(5) == 5 and to_block_hash(2**64 - 1) == 2**64 - 1
    assert to_block_hash("0x10") == 16 and to_block_hash("ff" * 32) == 2**64 - 1
    for bad in ("", -5, -1, 2**64, "-5"):  # TRT-LLM's keys are unsigned 64-bit
        with pytest.raises(EventError):
            to_block_hash(bad)


@pytest.mark.parametrize("block, reason", [
    ({"block_hash": -5}, "block hash out of range"),
    ({"block_hash": 2**64}, "block hash out of range"),
    ({"block_hash": 7, "tokens": "many"}, "block tokens not a list"),
    ({"block_hash": 7, "tokens": 12}, "block tokens not a list"),
    ({"tokens": []}, "missing key 'block_hash'"),
])
def test_a_stored_block_with_a_bad_hash_or_token_count_is_rejected_and_counted_by_reason(block, reason):
    mapper = TrtllmEventMapper()
    event = {"data": {"type": "stored", "parent_hash": None,
                      "blocks": [{"block_hash": 3, "tokens": []}, block]}}
    assert table(mapper.map_events([event, DRAIN_1[1]], 1.0)) == table(
        TrtllmEventMapper().map_events([DRAIN_1[1]], 1.0))  # the bad event maps not at all
    assert mapper.bad_events == 1 and dict(mapper.rejected) == {reason: 1}


def test_the_poller_reports_the_events_it_skipped(engine):
    poller = TrtllmEventPoller(TrtllmPollerConfig(url=engine.url + "/kv_cache_events"), lambda b: None)
    poller.deliver([{"data": {"type": "removed", "block_hashes": [-5]}}, DRAIN_1[1]])
    assert poller.stats.bad_events == 1 and poller.stats.block_events == 2


@pytest.fixture
def engine():
    server = FakeEngineHttp()
    yield server
    server.close()


def test_poller_drains_over_http_and_batches_land_in_the_store(engine):
    engine.routes[("POST", "/kv_cache_events")] = [
        (200, json.dumps(DRAIN_1).encode()), (200, json.dumps(DRAIN_2).encode()), (200, b"[]")]
    batches = []
    poller = TrtllmEventPoller(TrtllmPollerConfig(url=engine.url + "/kv_cache_events",
                                                  instance="gpu-node-1"),
                               batches.append, clock=lambda: 50.0)
    assert [poller.poll() for _ in range(3)] == [2, 6, 0]
    assert [b.sequence for b in batches] == [0, 1]
    store = TraceStore(":memory:")
    for batch in batches:
        store.ingest(batch)
    kinds = store.query("select kind, count(*) n from block_events group by kind order by kind")
    assert dict(zip(*kinds.to_pydict().values())) == {
        "store": 4, "evict": 2, "priority_update": 1, "cpu_promotion": 1}
    assert engine.requests == [("POST", "/kv_cache_events")] * 3


def test_poller_skips_bad_bodies_and_raises_for_an_engine_error(engine):
    engine.routes[("POST", "/kv_cache_events")] = [
        (500, b"boom"), (200, b"{not json"), (200, b'{"an": "object"}'),
        (200, json.dumps(DRAIN_1).encode())]
    batches = []
    poller = TrtllmEventPoller(TrtllmPollerConfig(url=engine.url + "/kv_cache_events"),
                               batches.append)
    with pytest.raises(OSError, match="500"):  # the service's runner retries it
        poller.poll()
    assert [poller.poll() for _ in range(3)] == [0, 0, 2]
    assert poller.stats.fetch_errors == 1 and poller.stats.bad_bodies == 1
    assert poller.mapper.bad_events == 1 and len(batches) == 1


def test_a_stop_takes_what_the_engine_holds_once_more_and_never_raises(engine):
    engine.routes[("POST", "/kv_cache_events")] = [(200, json.dumps(DRAIN_1).encode())]
    batches = []
    poller = TrtllmEventPoller(TrtllmPollerConfig(url=engine.url + "/kv_cache_events"),
                               batches.append)
    assert poller.drain(5.0) == 0 and len(batches) == 1  # nothing waits in the poller itself
    assert poller.drain(0.0) == 0 and len(engine.requests) == 1  # no grace: no request
    engine.close()
    assert poller.drain(1.0) == 0  # an engine already gone is no error at stop


def test_poller_raises_for_an_unreachable_engine():
    poller = TrtllmEventPoller(TrtllmPollerConfig(url="http://127.0.0.1:9/kv_cache_events",
                                                  timeout_s=1.0), lambda b: None)
    with pytest.raises(OSError, match="127.0.0.1:9"):
        poller.poll()
    assert poller.stats.fetch_errors == 1


def test_config_validation():
    with pytest.raises(ValueError, match="http"):
        TrtllmPollerConfig(url="ftp://x")
    with pytest.raises(ValueError, match="interval_s"):
        TrtllmPollerConfig(interval_s=0)


def test_fuzzed_events_never_raise():
    import random

    rng = random.Random(11)
    atoms = [None, True, -1, 0, 1, 2**70, 1.5, "", "zz", "ab" * 40, [], {}, [1, "x"], {"type": 1},
             "stored", "removed", "updated", "created", [0, 1], {"old_value": 0, "new_value": 1}]

    def junk(depth=0):
        roll = rng.random()
        if depth > 3 or roll < 0.4:
            return rng.choice(atoms)
        if roll < 0.7:
            return [junk(depth + 1) for _ in range(rng.randrange(4))]
        keys = ["data", "type", "blocks", "block_hash", "block_hashes", "cache_level",
                "priority", "old_value", "new_value", "parent_hash", "tokens", "stored",
                "removed", "updated", "created", "num_blocks_per_cache_level"]
        return {rng.choice(keys): junk(depth + 1) for _ in range(rng.randrange(5))}

    mapper = TrtllmEventMapper()
    for _ in range(2000):
        events = [junk() for _ in range(rng.randrange(4))]
        for event in mapper.map_events(events, 1.0):
            assert 0 <= event.block_hash < 2**64
    assert mapper.map_events({"not": "a list"}, 1.0) == []
