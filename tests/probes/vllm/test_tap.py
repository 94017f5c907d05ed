"""The vLLM KV-event tap over real ZMQ sockets on 127.0.0.1, against a publisher written from
the documented wire format (tests/probes/vllm/fake_vllm.py)."""

from __future__ import annotations

import time

import pytest

from kvtier.collector.store import TraceStore
from tests.probes.vllm.fake_vllm import FakePublisher, cleared, removed, stored
from kvtier.probes.vllm.tap import VllmEventTap, VllmTapConfig

pytestmark = pytest.mark.timeout(20)


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def rig():
    made = []

    def build(replay=True, **config):
        pub = FakePublisher("tcp://127.0.0.1:0", replay=replay)
        replays = ((0, pub.replay_endpoint),) if replay else ()
        batches, clock = [], Clock()
        tap = VllmEventTap(VllmTapConfig(endpoints=(pub.endpoint,), replay_endpoints=replays,
                                         instance="node-a", **config), batches.append, clock=clock)
        tap.open()
        pub.wait_for_subscriber()
        made.append((pub, tap))
        return pub, tap, batches, clock

    yield build
    for pub, tap in made:
        tap.close()
        pub.close()


def drain(tap, batches, want, rounds=50):
    """Poll until ``want`` batches arrived (bounded, so a bug fails instead of hanging)."""
    for _ in range(rounds):
        if len(batches) >= want:
            return
        tap.poll(0.1)
    raise AssertionError(f"got {len(batches)} batches, wanted {want}")


def rows(batch):
    return batch.block_events.to_pylist()


def test_stored_removed_become_store_and_evict_rows_in_the_store(rig):
    pub, tap, batches, _ = rig()
    pub.publish([stored([11, 12], parent=7, medium="GPU"), stored([11], medium="CPU"),
                 removed([12], medium="GPU"), stored([2**64 - 1], medium="STORAGE")])
    drain(tap, batches, 1)
    got = rows(batches[0])
    assert [(r["kind"], r["block_hash"], r["parent_hash"], r["tier_from"], r["tier_to"])
            for r in got] == [
        ("store", 11, 7, None, "gpu"), ("store", 12, 11, None, "gpu"),
        ("store", 11, None, "gpu", "cpu"), ("evict", 12, None, "gpu", None),
        ("store", 2**64 - 1, None, "cpu", "cold")]
    assert got[0]["tokens"] == 4 and got[0]["time_s"] == 1700000000.5
    store = TraceStore(":memory:")
    assert store.ingest(batches[0]).block_events == 5
    assert store.ingest(batches[0]).duplicate  # same (source, sequence): stored once


def test_gap_is_healed_from_the_replay_socket(rig):
    pub, tap, batches, _ = rig()
    pub.publish([stored([1])])
    pub.publish([stored([2])], send=False)  # lost on the wire
    pub.publish([stored([3])], send=False)
    pub.publish([stored([4])])
    drain(tap, batches, 2)
    assert tap.stats.gaps == 1 and tap.stats.replay_requests == 1
    assert pub.serve_replay() == 1  # asked from the first missing sequence
    drain(tap, batches, 4)
    tap.poll(0.2)  # the end marker and the already-seen seq 3 duplicate
    assert sorted(b.sequence for b in batches) == [0, 1, 2, 3]
    assert tap.stats.replayed_batches == 2 and tap.stats.replay_duplicates == 1
    assert tap.stats.lost_batches == 0 and len({b.origin.source for b in batches}) == 1


def test_gap_beyond_the_replay_buffer_counts_lost(rig):
    pub, tap, batches, _ = rig()
    pub.publish([stored([1])])
    pub.publish([stored([2])], send=False)
    pub.buffer.clear()  # the publisher's ring buffer has moved on
    pub.publish([stored([3])])
    drain(tap, batches, 2)
    pub.serve_replay()
    for _ in range(20):
        tap.poll(0.05)
        if not tap.snapshot()["/dp0"]["missing"]:
            break
    assert tap.stats.lost_batches == 1 and [b.sequence for b in batches] == [0, 2]


def test_unanswered_replay_times_out_and_counts_lost(rig):
    pub, tap, batches, clock = rig(replay_timeout_s=1.0)
    pub.publish([stored([1])])
    pub.publish([stored([2])], send=False)
    pub.publish([stored([3])])
    drain(tap, batches, 2)
    clock.now += 1.5
    tap.poll(0)
    assert tap.stats.replay_timeouts == 1 and tap.stats.lost_batches == 1


def test_without_a_replay_endpoint_a_gap_is_lost_not_requested(rig):
    pub, tap, batches, _ = rig(replay=False)
    pub.publish([stored([1])])
    pub.publish([stored([2])], send=False)
    pub.publish([stored([3])])
    drain(tap, batches, 2)
    assert tap.stats.replay_requests == 0 and tap.stats.lost_batches == 1


def test_publisher_restart_starts_a_new_source(rig):
    pub, tap, batches, clock = rig()
    pub.publish([stored([1])])
    pub.publish([stored([2])])
    drain(tap, batches, 2)
    pub.seq, pub.buffer = 0, []  # a restarted engine counts from 0 again
    clock.now += 60
    pub.publish([stored([9])])
    drain(tap, batches, 3)
    assert tap.stats.restarts == 1
    assert batches[2].sequence == 0 and batches[2].origin.source != batches[0].origin.source
    store = TraceStore(":memory:")
    assert [store.ingest(b).duplicate for b in batches] == [False, False, False]


def test_all_blocks_cleared_evicts_the_resident_gpu_blocks(rig):
    pub, tap, batches, _ = rig()
    pub.publish([stored([1, 2, 3]), removed([2]), stored([5], medium="CPU")])
    pub.publish([cleared(), stored([8])])
    drain(tap, batches, 2)
    got = [(r["kind"], r["block_hash"], r["tier_from"]) for r in rows(batches[1])]
    assert got == [("evict", 1, "gpu"), ("evict", 3, "gpu"),
                   ("store", 8, None)]


def test_dp_ranks_are_separate_streams(rig):
    pub, tap, batches, _ = rig()
    pub.publish([stored([1])])
    pub.dp_rank, pub.seq = 1, 0  # rank 1's publisher counts on its own
    pub.publish([stored([2])])
    pub.publish([stored([3])])
    drain(tap, batches, 3)
    assert tap.stats.restarts == 0 and tap.stats.gaps == 0
    assert len({b.origin.source for b in batches}) == 2


def test_legacy_array_events_and_byte_hashes(rig):
    pub, tap, batches, _ = rig()
    digest = bytes(range(32))
    pub.publish([["BlockStored", [digest], None, [1, 2], 2, None, "CPU", None],
                 ["BlockRemoved", [5], "GPU"]])
    drain(tap, batches, 1)
    got = [(r["kind"], r["block_hash"], r["tier_to"]) for r in rows(batches[0])]
    assert got == [("store", int.from_bytes(digest[-8:], "big"), "cpu"),
                   ("evict", 5, None)]


def test_tap_binds_and_a_connecting_publisher_reaches_it():
    batches = []
    tap = VllmEventTap(VllmTapConfig(endpoints=("tcp://127.0.0.1:0",), bind=True), batches.append)
    (endpoint,) = tap.open()
    pub = FakePublisher(endpoint, bind=False, replay=False)
    try:
        pub.wait_for_subscriber(tap)
        pub.publish([stored([42])])
        drain(tap, batches, 1)
        assert rows(batches[0])[0]["block_hash"] == 42
    finally:
        tap.close()
        pub.close()


def test_bad_frames_are_counted_and_good_ones_still_delivered(rig):
    pub, tap, batches, _ = rig()
    pub.send_raw([b"", b"short", b"x"])
    pub.send_raw([b"", (0).to_bytes(8, "big"), b"\xc1\xc1 not msgpack"])
    pub.send_raw([b"only-one-frame"])
    pub.publish([stored([1]), {"type": "Mystery"}, stored(["not-a-hash"])])
    drain(tap, batches, 1)
    assert tap.stats.bad_frames == 3 and tap.stats.bad_events == 2
    assert [r["block_hash"] for r in rows(batches[0])] == [1]


def test_the_services_runner_drives_the_tap_and_closes_it(rig):
    from kvtier.collector.taps import TapRunner

    pub, tap, batches, _ = rig()
    runner = TapRunner(tap)
    runner.start()
    try:
        pub.publish([stored([1])])
        for _ in range(100):
            if batches:
                break
            import time
            time.sleep(0.02)
    finally:
        runner.stop()
    assert len(batches) == 1
    assert runner.health().state == "stopped" and tap._sub is None


def test_config_refuses_all_interfaces_and_bad_endpoints():
    with pytest.raises(ValueError, match="all interfaces"):
        VllmTapConfig(endpoints=("tcp://*:5557",), bind=True)
    with pytest.raises(ValueError, match="bad ZMQ endpoint"):
        VllmTapConfig(endpoints=("localhost:5557",))
    with pytest.raises(ValueError, match="distinct dp ranks"):
        VllmTapConfig(replay_endpoints=((0, "tcp://a:1"), (0, "tcp://b:2")))


def test_sglang_streams_use_the_same_tap(rig):
    pub, tap, batches, _ = rig(engine="sglang")
    pub.publish([{"type": "BlockStored", "block_hashes": [5], "parent_block_hash": None,
                  "token_ids": [1, 2], "block_size": 2, "lora_id": None}])  # no medium
    drain(tap, batches, 1)
    assert batches[0].origin.engine == "sglang" and batches[0].origin.source.startswith("sglang-zmq:")
    assert rows(batches[0])[0]["tier_to"] == "gpu"


def test_rows_the_schema_rejects_are_counted(rig):
    pub, tap, batches, _ = rig()
    pub.publish([stored([1], tokens=()), {"type": "BlockStored", "block_hashes": [2],
                                          "parent_block_hash": None, "token_ids": [],
                                          "block_size": 2**40, "medium": "GPU"}])
    drain(tap, batches, 1)
    assert [r["block_hash"] for r in rows(batches[0])] == [1]
    assert tap.stats.bad_events == 1


def test_coalesced_frames_become_one_batch_per_poll_named_by_the_last_sequence(rig):
    pub, tap, batches, clock = rig(coalesce_frames=True)
    for h in (1, 2, 3):
        pub.publish([stored([h])])
    for _ in range(50):
        if tap.stats.batches == 3:
            break
        tap.poll(0.1)
    assert tap.stats.batches == 3
    assert [b.sequence for b in batches][-1] == 2
    assert sorted(r["block_hash"] for b in batches for r in rows(b)) == [1, 2, 3]
    pub.seq, pub.buffer = 0, []  # restart: the new incarnation's rows go under a new source
    clock.now += 5
    pub.publish([stored([9])])
    drain(tap, batches, len(batches) + 1)
    assert batches[-1].origin.source != batches[0].origin.source
    store = TraceStore(":memory:")
    assert sum(store.ingest(b).block_events for b in batches) == 4


def test_replay_answers_are_read_while_a_flood_of_live_frames_waits(rig):
    pub, tap, batches, _ = rig(receive_hwm=100_000)
    pub.publish([stored([1])])
    pub.publish([stored([2])], send=False)  # lost on the wire
    pub.publish([stored([3])])
    drain(tap, batches, 2)
    assert pub.serve_replay() == 1
    for h in range(4, 3004):  # far more live frames than one round reads
        pub.publish([stored([h])])
    time.sleep(0.3)  # all of it waits at the tap's sockets now
    tap.poll(0.1, max_messages=1500)
    assert tap.stats.replayed_batches == 1  # the gap healed inside that poll
    # its three replay messages (seq 1, the duplicate seq 2, the end marker) took three of
    # the 1500 reads; the live frames the rest
    assert tap.stats.replay_duplicates == 1 and tap.stats.batches == 2 + 1 + 1497


def restarted_collector(tmp_path, replay: bool):
    """A collector's tap and store stop after seq 0-1; the engine publishes 2-3 meanwhile; a
    new tap over the reopened store (as `kvtier collect` runs it) then gets seq 4."""
    from kvtier.collector.taps import TapRunner

    pub = FakePublisher("tcp://127.0.0.1:0", replay=replay)
    config = VllmTapConfig(endpoints=(pub.endpoint,), instance="node-a",
                           replay_endpoints=((0, pub.replay_endpoint),) if replay else ())
    path = tmp_path / "kvtier.duckdb"
    try:
        with TraceStore(path) as store:
            first = VllmEventTap(config, store.ingest, clock=Clock(), resume=store.latest_source)
            first.open()
            pub.wait_for_subscriber()
            pub.publish([stored([1])])
            pub.publish([stored([2])])
            for _ in range(50):
                first.poll(0.1)
                if store.count("ingested_batches") == 2:
                    break
            first.close()
        pub.publish([stored([3])], send=False)  # nobody listens: the collector is down
        pub.publish([stored([4])], send=False)
        store = TraceStore(path)
        batches = []

        def ingest(batch):
            batches.append(batch)
            store.ingest(batch)

        tap = VllmEventTap(config, ingest, clock=Clock(2000.0), resume=store.latest_source)
        runner = TapRunner(tap)
        runner.open()
        for _ in range(100):  # the first tap's unsubscription may come first
            if pub.pub.poll(50) and pub.pub.recv()[:1] == b"\x01":
                break
        pub.publish([stored([5])])
        drain(tap, batches, 1)
        return pub, tap, runner, store, batches
    except BaseException:
        pub.close()
        raise


def test_a_restarted_collector_counts_what_it_missed_and_heals_it_by_replay(tmp_path):
    pub, tap, runner, store, batches = restarted_collector(tmp_path, replay=True)
    try:
        assert tap.stats.resumed_streams == 1 and tap.stats.gaps == 1
        assert pub.serve_replay() == 2  # from the first sequence the store lacks
        drain(tap, batches, 3)
        tap.poll(0.2)
        assert tap.stats.lost_batches == 0 and tap.stats.restarts == 0
        # one source, as before the restart: seq 0-4 stored once each
        assert store.scalar("SELECT count(DISTINCT source) FROM ingested_batches") == 1
        stored_seqs = store.query("SELECT sequence FROM ingested_batches ORDER BY 1")
        assert stored_seqs.column(0).to_pylist() == [0, 1, 2, 3, 4]
        health = runner.health().to_dict()
        assert (health["sequence_gaps_total"], health["lost_batches_total"]) == (1, 0)
    finally:
        runner.stop()
        store.close()
        pub.close()


def test_a_restarted_collector_without_replay_counts_the_gap_as_lost(tmp_path):
    pub, tap, runner, store, batches = restarted_collector(tmp_path, replay=False)
    try:
        tap.poll(0)
        assert (tap.stats.gaps, tap.stats.lost_batches, tap.stats.replay_requests) == (1, 2, 0)
        assert batches[0].sequence == 4
        assert store.scalar("SELECT count(DISTINCT source) FROM ingested_batches") == 1
        health = runner.health()
        assert health.up and (health.sequence_gaps_total, health.lost_batches_total) == (1, 2)
    finally:
        runner.stop()
        store.close()
        pub.close()


@pytest.mark.timeout(60)
def test_a_stop_hands_over_every_frame_already_in_the_socket():
    from kvtier.collector.taps import TapRunner

    slow = []

    def store_slowly(batch):  # a store slower than the publisher: frames queue in the socket,
        time.sleep(0.12)      # more than a stop that waited 5 s for the thread would take
        slow.append(batch)

    pub = FakePublisher("tcp://127.0.0.1:0", replay=False)
    tap = VllmEventTap(VllmTapConfig(endpoints=(pub.endpoint,), instance="node-a"), store_slowly)
    runner = TapRunner(tap)
    runner.open()
    try:
        pub.wait_for_subscriber()
        runner.start()
        for block in range(50):
            pub.publish([stored([block])])
        assert runner.stop(grace_s=30.0) == 0
    finally:
        runner.stop()
        pub.close()
    assert sorted(r["block_hash"] for b in slow for r in rows(b)) == list(range(50))
    assert tap._sub is None  # closed by the polling thread, after it drained
