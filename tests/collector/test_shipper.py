"""The engine-side shipper against the collector's hooks tap, over real loopback ZMQ sockets:
batches reach the store once, an absent collector costs counted drops and never a wait, and
a shutdown flushes what is buffered within its bound."""

from __future__ import annotations

import time

import pytest

from kvtier.collector.events import Origin, Outcome, RequestRecord, Tier
from kvtier.collector.hooks_tap import HooksTap, HooksTapConfig
from kvtier.collector.recorder import Recorder
from kvtier.collector.shipper import Shipper, ShipperConfig, endpoint_from
from kvtier.collector.taps import TapRunner
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(60)


ANY_PORT = "tcp://127.0.0.1:0"  # a tap binds it and says which port it got


def unbound_endpoint() -> str:
    """An endpoint for a shipper with no collector bound yet (or ever): the port must be
    known before anything binds it, so it is picked free (tests/conftest.py free_port)."""
    return f"tcp://127.0.0.1:{free_port()}"


def recorder(name: str = "engine-a", **kwargs) -> Recorder:
    return Recorder(Origin("vllm", name, f"vllm-hooks:{name}:1"), **kwargs)


def record_requests(rec: Recorder, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        rid = f"req-{i}"
        rec.record(int(Outcome.GPU_HIT), 1000 + i, request_id=rid, position=0, tokens=32,
                   tier_to=int(Tier.GPU), time_s=10.0 + i)
        rec.record_run(int(Outcome.STORE), [(2000 + i).to_bytes(8, "little")], rid, 4096,
                       int(Tier.GPU), int(Tier.CPU), 0.001, 10.5 + i)
        rec.record_request(RequestRecord(rid, 10.0 + i, 64, output_tokens=4, gpu_hit_tokens=32,
                                         recomputed_tokens=32, finish_status="length"))


class Collected:
    """A hooks tap storing into an in-memory store (the service's ingest, minus exports)."""

    def __init__(self, store, where: str = ANY_PORT):
        self.store = store
        self.tap = HooksTap(HooksTapConfig((where,)), store.ingest, resume=store.next_sequence)
        self.runner = TapRunner(self.tap)  # what the collector service runs it with
        self.runner.open()
        (self.where,) = self.runner.endpoints  # the port bound for :0
        self.runner.start()

    def wait_for(self, requests: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.store.count("requests") < requests and time.monotonic() < deadline:
            time.sleep(0.02)

    def samples(self) -> dict:
        return {s.name: s.value for s in self.tap.samples()}


def test_batches_reach_the_store_with_their_request_ids_and_fields(store):
    collected = Collected(store)
    rec = recorder()
    shipper = Shipper(ShipperConfig(collected.where, interval_s=0.05))
    shipper.add(rec)
    try:
        time.sleep(0.3)  # the PUSH socket connects
        record_requests(rec, 3)
        collected.wait_for(3)
    finally:
        shipper.close()
        collected.runner.stop()
    rows = store.query("SELECT kind, block_hash, request_id, tier_from, tier_to, size_bytes "
                       "FROM block_events ORDER BY time_s").to_pylist()
    assert [(r["kind"], r["block_hash"], r["request_id"]) for r in rows] == [
        (kind, base + i, f"req-{i}") for i in range(3) for kind, base in
        (("gpu_hit", 1000), ("store", 2000))]
    assert rows[1]["tier_from"] == "gpu" and rows[1]["size_bytes"] == 4096
    requests = store.query("SELECT request_id, finish_status FROM requests ORDER BY arrival_s")
    assert requests.to_pylist() == [{"request_id": f"req-{i}", "finish_status": "length"}
                                    for i in range(3)]
    sequences = store.query("SELECT sequence FROM ingested_batches ORDER BY sequence")
    assert sequences.column(0).to_pylist() == list(range(len(sequences)))  # 0, 1, ... no gap
    assert collected.samples()["kvtier_recorder_dropped_events_total"] == 0


def test_without_a_collector_batches_are_dropped_counted_and_the_count_arrives_later(store):
    where = unbound_endpoint()
    rec = recorder()
    shipper = Shipper(ShipperConfig(where, interval_s=0.05))
    shipper.add(rec)
    record_requests(rec, 4)
    started = time.monotonic()
    while shipper.batches_dropped == 0 and time.monotonic() - started < 5:
        time.sleep(0.02)
    assert shipper.batches_dropped >= 1
    collected = Collected(store, where)
    try:
        time.sleep(0.3)
        record_requests(rec, 2, start=4)
        collected.wait_for(2)
    finally:
        shipper.close()
        collected.runner.stop()
    assert store.count("requests") == 2
    counters = collected.samples()
    assert counters["kvtier_recorder_dropped_events_total"] == 8  # 4 requests x 2 events
    assert counters["kvtier_recorder_dropped_requests_total"] == 4
    assert counters["kvtier_hooks_lost_batches_total"] == 0  # refused, not lost in transit


def test_close_flushes_what_is_buffered_and_is_bounded_without_a_collector(store):
    collected = Collected(store)
    rec = recorder()
    shipper = Shipper(ShipperConfig(collected.where, interval_s=3600))  # only a flush ships
    shipper.add(rec)
    time.sleep(0.3)
    record_requests(rec, 5)
    shipper.close()
    collected.wait_for(5)
    collected.runner.stop()
    assert store.count("requests") == 5
    lonely = recorder("engine-b")
    alone = Shipper(ShipperConfig(unbound_endpoint(), interval_s=3600, flush_timeout_s=0.3))
    alone.add(lonely)
    record_requests(lonely, 1)
    began = time.monotonic()
    alone.close()
    assert time.monotonic() - began < 1.5  # waited for a collector at most the bound
    assert alone.batches_dropped == 1


def test_recording_never_waits_for_the_shipper():
    rec = recorder(capacity_events=1000)
    shipper = Shipper(ShipperConfig(unbound_endpoint(), interval_s=0.01))  # no collector at all
    shipper.add(rec)
    began = time.perf_counter()
    for i in range(20_000):
        rec.record(int(Outcome.GPU_HIT), i, time_s=1.0)
    elapsed = time.perf_counter() - began
    shipper.close(0.1)
    assert elapsed < 2.0  # ~20k appends; a wait on the socket would take far longer
    assert rec.dropped_events + shipper.batches_dropped > 0


def test_a_batch_lost_in_transit_is_counted_from_the_sequence_gap(store):
    from kvtier.collector.shipment import Shipment, encode

    tap = HooksTap(HooksTapConfig((ANY_PORT,)), store.ingest)
    (where,) = tap.open()
    rec = recorder()
    import zmq

    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(where)
    try:
        first_event = 0
        for sequence in (0, 2):  # batch 1 never arrives
            record_requests(rec, 1, start=sequence)
            packed = rec.take_packed()
            push.send_multipart(encode(Shipment(packed, sequence, first_event)))
            first_event += packed.num_events * (2 if sequence == 0 else 1)
        deadline = time.monotonic() + 5
        while tap.stats.batches < 2 and time.monotonic() < deadline:
            tap.poll(0.1)
    finally:
        push.close(linger=0)
        tap.close()
    counters = {s.name: s.value for s in tap.samples()}
    assert (counters["kvtier_hooks_lost_batches_total"], counters["kvtier_hooks_lost_events_total"]) == (1, 2)
    assert store.count("requests") == 2


def test_bad_messages_are_counted_and_skipped(store):
    import zmq

    tap = HooksTap(HooksTapConfig((ANY_PORT,)), store.ingest)
    (where,) = tap.open()
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(where)
    try:
        for frames in ([b"one frame"], [b"{}", b"", b"[]"], [b"not json", b"", b"[]"],
                       [b'{"format": "kvtier.hooks/1", "events": 1}', b"x" * 10, b"[]"]):
            push.send_multipart(frames)
        deadline = time.monotonic() + 5
        while tap.stats.bad_frames < 4 and time.monotonic() < deadline:
            tap.poll(0.1)
    finally:
        push.close(linger=0)
        tap.close()
    assert tap.stats.bad_frames == 4 and store.count("requests") == 0


def test_the_endpoint_comes_from_the_config_then_the_environment_then_loopback(monkeypatch):
    monkeypatch.delenv("KVTIER_COLLECTOR", raising=False)
    assert endpoint_from(None) == "tcp://127.0.0.1:5570"
    monkeypatch.setenv("KVTIER_COLLECTOR", "tcp://10.0.0.5:6000")
    assert endpoint_from(None) == "tcp://10.0.0.5:6000"
    assert endpoint_from("ipc:///tmp/kvtier.sock") == "ipc:///tmp/kvtier.sock"
    with pytest.raises(ValueError, match="endpoint must be a ZMQ endpoint"):
        ShipperConfig("localhost:5570")
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        ShipperConfig(interval_s=0)


def test_a_hooks_tap_config_refuses_an_empty_commit_group():
    with pytest.raises(ValueError, match="commit_events must be >= 1, got 1000, 268435456, 0"):
        HooksTapConfig(commit_events=0)


def test_a_busy_hooks_endpoint_is_an_os_error(store):
    first = HooksTap(HooksTapConfig((ANY_PORT,)), store.ingest)
    (where,) = first.open()
    try:
        with pytest.raises(OSError, match="cannot bind hooks endpoint"):
            HooksTap(HooksTapConfig((where,)), store.ingest).open()
    finally:
        first.close()


def test_healthz_lists_each_engine_stream_the_hooks_tap_received_from(store):
    tap = HooksTap(HooksTapConfig((ANY_PORT,)), store.ingest, clock=lambda: 1234.5)
    runner = TapRunner(tap)
    assert runner.health().to_dict()["sources"] == []  # none seen yet: the plug-ins are not live
    runner.open()
    (where,) = runner.endpoints
    runner.start()
    recorders = [recorder("engine-a"), recorder("engine-b")]
    shipper = Shipper(ShipperConfig(where, interval_s=0.05))
    for rec in recorders:
        shipper.add(rec)
    try:
        time.sleep(0.3)  # the PUSH socket connects
        for rec in recorders:
            record_requests(rec, 2)
        deadline = time.monotonic() + 10
        while store.count("requests") < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        shipper.close()
        runner.stop()
    rows = store.query("SELECT source, count(*) AS n FROM ingested_batches GROUP BY source")
    batches = {r["source"]: r["n"] for r in rows.to_pylist()}
    assert runner.health().to_dict()["sources"] == [
        {"source": f"vllm-hooks:{name}:1", "engine": "vllm", "instance": name,
         "batches": batches[f"vllm-hooks:{name}:1"], "last_batch_s": 1234.5}
        for name in ("engine-a", "engine-b")]


def send_and_poll(tap: HooksTap, messages: list[list[bytes]]) -> None:
    """Send ``messages`` to ``tap`` over its socket and poll it until it took every one (it
    reads what is queued in one poll: all of them, mostly)."""
    import zmq

    (where,) = tap.open()
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.connect(where)
    try:
        for frames in messages:
            push.send_multipart(frames)
        time.sleep(0.2)  # let them queue at the tap, so one poll finds them together
        deadline = time.monotonic() + 30
        while tap.stats.batches + tap.stats.bad_frames < len(messages):
            assert time.monotonic() < deadline, tap.stats
            tap.poll(0.5)
    finally:
        push.close(linger=0)
        context.term()
        tap.close()


def test_what_one_poll_reads_is_stored_in_commit_groups_of_bounded_size(store):
    """Shipped batches read together go to the sink's ``many`` in order, in groups of at most
    the tap's ``commit_events`` (here 8 block events: two batches of 4), each group handed over
    as soon as it is full, before the tap reads on (so it holds one group ahead of the store);
    each batch counted once; a bad message among them skipped; a plain callable sink gets
    them one by one."""
    from kvtier.collector.shipment import Shipment, encode
    from kvtier.collector.taps import BatchSink

    rec, messages, first_event = recorder(), [], 0
    for sequence in range(5):
        record_requests(rec, 2, start=2 * sequence)  # 4 block events a batch
        packed = rec.take_packed()
        messages.append(encode(Shipment(packed, sequence, first_event)))
        first_event += packed.num_events
    messages.insert(2, [b"not json", b"", b"[]"])  # read after batch 1, before batch 2
    groups = []  # (sequences, bad messages the tap had read when it handed the group over)
    config = HooksTapConfig((ANY_PORT,), commit_events=8)
    tap = HooksTap(config, BatchSink(store.ingest, lambda batches: groups.append(
        ([b.sequence for b in batches], tap.stats.bad_frames)) or store.ingest_many(batches)))
    send_and_poll(tap, messages)
    assert [sequence for sequences, _ in groups for sequence in sequences] == [0, 1, 2, 3, 4]
    assert all(len(sequences) <= 2 for sequences, _ in groups)
    # the bad message comes after batch 1: a group ending at batch 1 went in before it was read
    assert all(bad == (sequences[-1] >= 2) for sequences, bad in groups), groups
    assert tap.stats.bad_frames == 1 and tap.stats.batches == 5 and tap.stats.gaps == 0
    assert store.count("requests") == 10
    one = []
    send_and_poll(HooksTap(config, one.append), messages)
    assert [b.sequence for b in one] == [0, 1, 2, 3, 4]
