"""The vLLM hook logic without vLLM: import safety and the recording rules."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvtier.collector.events import Origin, Outcome, Tier
from kvtier.collector.recorder import Recorder
from kvtier.probes.vllm.recording import ManagerRecorder, key_hash
from kvtier.probes.vllm.block_records import BlockRecords


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def k(i: int) -> bytes:
    return i.to_bytes(32, "big") + (0).to_bytes(4, "big")


@pytest.fixture
def rec():
    clock = Clock()
    recorder = Recorder(Origin("vllm", "t", "t-1"), clock=clock)
    return ManagerRecorder(recorder, chunk_bytes=2048, clock=clock), recorder, clock


def rows(recorder):
    return [(r["kind"], r["block_hash"], r["tier_from"], r["tier_to"], r["latency_s"])
            for r in recorder.take_events().block_events.to_pylist()]


def test_plugin_modules_import_without_vllm():
    """vLLM loads the spec by module path; everything it leans on imports without vLLM."""
    code = ("import sys, kvtier.probes.vllm.recording, kvtier.probes.vllm.recorders, kvtier.probes.vllm.block_records, "
            "kvtier.probes.vllm.connector, kvtier.probes.vllm.cache_policy; print('vllm' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_key_hash_drops_the_group_index():
    assert key_hash(k(7)) == 7


def test_store_load_and_eviction_rules(rec):
    observer, recorder, clock = rec
    observer.prepared_store([k(1), k(2)], [k(9)], "r")
    clock.now += 0.5
    observer.completed_store([k(1), k(2), k(3)], True, "r")  # k(3) was never prepared: skipped
    observer.prepared_load([k(1), k(2)], ["host", "disk"], "r")
    clock.now += 0.25
    observer.completed_load([k(1), k(2)], "r")
    observer.lookup(k(4), "MISS", "r")
    observer.lookup(k(5), "HIT", "r")
    assert rows(recorder) == [
        ("evict", 9, "cpu", None, None), ("store", 1, "gpu", "cpu", 0.5),
        ("store", 2, "gpu", "cpu", 0.5), ("cpu_promotion", 1, "cpu", "gpu", 0.25),
        ("cold_promotion", 2, "cold", "gpu", 0.25), ("recompute_miss", 4, None, None, None)]


def test_failed_store_is_a_drop(rec):
    observer, recorder, _ = rec
    observer.prepared_store([k(1)], [], "r")
    observer.completed_store([k(1)], False, "r")
    assert rows(recorder) == [("drop", 1, "gpu", None, None)]


class Event:
    def __init__(self, keys, medium, removed, metadata_only=False):
        self.keys, self.medium, self.removed, self.metadata_only = keys, medium, removed, metadata_only


def test_manager_events_add_only_what_the_wrapper_could_not_see(rec):
    observer, recorder, _ = rec
    observer.prepared_store([], [k(1)], "r")
    observer.offloading_events([
        Event([k(1), k(2)], "CPU", True),        # k(1) already reported; k(2) made room for a promotion
        Event([k(3)], "CPU", False),             # CPU stores come through complete_store
        Event([k(4)], "STORAGE", False),         # a cascade into the file tier
        Event([k(5)], "STORAGE", True, metadata_only=True)])
    assert rows(recorder) == [("evict", 1, "cpu", None, None), ("evict", 2, "cpu", None, None),
                              ("store", 4, "cpu", "cold", None)]


def test_policy_module_imports_and_configures_without_vllm():
    from kvtier.probes.vllm import cache_policy

    cache_policy.configure(lambda h: 0.0, threshold=0.3)
    cache_policy.configure(None)
    with pytest.raises(ValueError, match="threshold must be in 0..1"):
        cache_policy.configure(None, threshold=2)
    with pytest.raises(ValueError, match="callable"):
        cache_policy.configure(42)


def test_a_waiting_request_reports_each_miss_once(rec):
    observer, recorder, _ = rec
    for _ in range(3):  # looked up again on every scheduler step while it waits
        observer.lookup(k(4), "MISS", "r")
    observer.request_finished("r")
    observer.lookup(k(4), "MISS", "r")  # a new admission of the same id counts again
    assert [row[0] for row in rows(recorder)] == ["recompute_miss", "recompute_miss"]


# ---- the packed hot path (probes/vllm/block_records.py) against Recorder.record ----

CALLS = [  # (kind, key numbers, request_id, size_bytes, tier_from, tier_to, latency_s, time_s)
    (Outcome.EVICT, [9, 8], None, None, Tier.CPU, None, None, 100.0),
    (Outcome.STORE, [1, 2, 3, 4], "r", 2048, Tier.GPU, Tier.CPU, 0.5, 100.5),
    (Outcome.DROP, [5], "r", None, Tier.GPU, None, None, 100.5),
    (Outcome.COLD_PROMOTION, [2**64 - 1, 0], "r2", 2048, Tier.COLD, Tier.GPU, 0.25, 101.0),
    (Outcome.RECOMPUTE_MISS, [7], "r", None, None, None, None, None),  # the recorder's clock
    (Outcome.STORE, [6], None, 2048, Tier.CPU, Tier.COLD, None, 102.0),
]


def both_ways(calls, capacity_events=1 << 20, key=k, tokens=None):
    """The same calls through BlockRecords.add and through one Recorder.record per key."""
    clock = Clock()
    packed = Recorder(Origin("vllm", "t", "t-1"), clock=clock, capacity_events=capacity_events)
    one_by_one = Recorder(Origin("vllm", "t", "t-1"), clock=clock,
                          capacity_events=capacity_events)
    add = BlockRecords(packed).add
    for kind, numbers, *fields in calls:
        add(int(kind), [key(n) for n in numbers], *fields, tokens=tokens)
        for n in numbers:
            request_id, size_bytes, tier_from, tier_to, latency_s, time_s = fields
            one_by_one.record(kind, key_hash(key(n)), request_id=request_id, tokens=tokens,
                              size_bytes=size_bytes, tier_from=tier_from, tier_to=tier_to,
                              latency_s=latency_s, time_s=time_s)
    return packed, one_by_one


def drained(recorder):
    batch = recorder.take_events()
    return (batch.block_events.to_pylist(), dict(batch.rejected), recorder.dropped_events)


def test_packed_runs_record_what_record_would():
    packed, one_by_one = both_ways(CALLS)
    rows, rejected, dropped = drained(packed)
    assert (rows, rejected, dropped) == drained(one_by_one)
    assert [r["block_hash"] for r in rows] == [9, 8, 1, 2, 3, 4, 5, 2**64 - 1, 0, 7, 6]
    assert rows[9]["time_s"] == 100.0  # no time given: the recorder's clock


def test_packed_runs_carry_each_blocks_tokens_as_record_would():
    packed, one_by_one = both_ways(CALLS, tokens=32)
    rows, rejected, dropped = drained(packed)
    assert (rows, rejected, dropped) == drained(one_by_one)
    assert [r["tokens"] for r in rows] == [32] * len(rows)


def test_every_hook_event_carries_the_chunk_tokens():
    clock = Clock()
    recorder = Recorder(Origin("vllm", "t", "t-1"), clock=clock)
    observer = ManagerRecorder(recorder, chunk_bytes=2048, chunk_tokens=32, clock=clock)
    observer.prepared_store([k(1), k(2)], [k(9)], "r")
    observer.completed_store([k(1)], True, "r")
    observer.completed_store([k(2)], False, "r")
    observer.prepared_load([k(1)], None, "r")
    observer.completed_load([k(1)], "r")
    observer.lookup(k(4), "MISS", "r")
    observer.offloading_events([Event([k(1)], "STORAGE", False), Event([k(7)], "CPU", True)])
    got = [(r["kind"], r["tokens"]) for r in recorder.take_events().block_events.to_pylist()]
    assert got == [("evict", 32), ("store", 32), ("drop", 32), ("cpu_promotion", 32),
                   ("recompute_miss", 32), ("store", 32), ("evict", 32)]


def test_a_run_past_the_capacity_keeps_what_fits_and_counts_the_rest():
    packed, one_by_one = both_ways(CALLS[:2] + CALLS[1:2], capacity_events=5)
    assert drained(packed) == drained(one_by_one)
    assert packed.dropped_events == 5  # 2 + 4 + 4 offered


def test_what_the_packed_form_cannot_hold_goes_through_record():
    short = lambda n: n.to_bytes(4, "big") + bytes(4)  # too short to hold a hash
    packed, one_by_one = both_ways(CALLS[:2], key=short)
    assert drained(packed) == drained(one_by_one)
    bad_request = [(Outcome.STORE, [1, 2], 42, 2048, Tier.GPU, Tier.CPU, 0.5, 100.5)]
    packed, one_by_one = both_ways(bad_request)  # a request id that is not a str
    assert drained(packed) == drained(one_by_one)
    assert packed.rejected_events == 0 and drained(both_ways(bad_request)[0])[1] == {
        "wrong type in record() call": 2}


def test_a_recorder_of_another_type_gets_one_record_call_per_key():
    calls = []

    class Double:
        def record(self, kind, block_hash, **fields):
            calls.append((kind, block_hash, fields["request_id"]))

    BlockRecords(Double()).add(int(Outcome.STORE), [k(1), k(2)], "r", 2048, 0, 1, 0.5, 1.0)
    assert calls == [(Outcome.STORE, 1, "r"), (Outcome.STORE, 2, "r")]
