"""The collector's writes: a batch the store refuses waits in a bounded backlog and is retried
in order with backoff; drops are counted; a stop makes one last attempt. And the store opens
its file again after DuckDB invalidated the connection (a checkpoint into a full disk)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import RequestRecord
from kvtier.collector.taps import Backoff, TapRunner
from kvtier.collector.writer import StoreWriter, batch_bytes
from tests.conftest import REPO, FixedClock

pytestmark = pytest.mark.timeout(60)


class RefusingStore:
    """A store that refuses writes while ``full`` is set, as a full disk does."""

    path = "refusing.duckdb"

    def __init__(self, store):
        self.store, self.full = store, False

    def ingest(self, batch):
        if self.full:
            raise OSError(27, "File too large")
        return self.store.ingest(batch)

    def ingest_many(self, batches):
        if self.full:
            raise OSError(27, "File too large")
        return self.store.ingest_many(batches)


def batch(origin, sequence: int) -> EventBatch:
    return EventBatch.from_rows(origin, sequence, requests=[RequestRecord(f"r{sequence}", 1.0, 64)])


@pytest.fixture
def rig(store, origin):
    refusing, seen, clock = RefusingStore(store), [], FixedClock(0.0)
    writer = StoreWriter(refusing, lambda stored: seen.extend(b.sequence for b, _ in stored),
                         backoff=Backoff(initial_s=1.0, max_s=4.0), clock=clock)
    return refusing, writer, seen, clock, lambda seq: batch(origin, seq)


def stored_sequences(store) -> list[int]:
    return [r["sequence"] for r in store.query(
        "SELECT sequence FROM ingested_batches ORDER BY batch_id").to_pylist()]


def test_refused_batches_wait_and_are_stored_in_order_once_writes_work(rig, store, caplog):
    refusing, writer, seen, clock, make = rig
    assert writer.write(make(0)).requests == 1
    refusing.full = True
    assert writer.write(make(1)) is None  # refused: kept
    refusing.full = False
    assert writer.write(make(2)) is None  # queued behind 1, not written before it
    health = writer.health()
    assert health.failing and health.backlog_batches == 2 and "File too large" in health.last_error
    assert writer.retry() == 0  # not due: the backoff's first second has not passed
    clock.advance(1.0)
    assert writer.retry() == 2
    assert stored_sequences(store) == [0, 1, 2] and seen == [0, 1, 2]
    health = writer.health()
    assert not health.failing and health.backlog_batches == 0 and health.dropped_batches_total == 0
    said = [r.getMessage() for r in caplog.records]
    assert sum("a write failed" in m for m in said) == 1 and sum("work again" in m for m in said) == 1


def test_a_group_is_one_commit_and_a_batch_it_cannot_store_waits_alone(rig, store, origin):
    refusing, writer, seen, clock, make = rig
    results = writer.write_many([make(0), make(1)])
    assert [r.requests for r in results] == [1, 1] and seen == [0, 1]
    good = make(2)
    broken = EventBatch(origin, 3, good.block_events, good.requests.drop_columns(["arrival_s"]))
    results = writer.write_many([good, broken, make(4)])  # the group fails: one by one then
    assert results[0].requests == 1 and results[1] is None and results[2] is None
    health = writer.health()
    assert health.failing and health.backlog_batches == 2
    assert health.last_error.startswith("requests batch columns")
    assert stored_sequences(store) == [0, 1, 2] and seen == [0, 1, 2]
    refusing.full = True  # a failing store keeps the whole group, in order, behind the backlog
    assert writer.write_many([make(5), make(6)]) == [None, None]
    assert writer.health().backlog_batches == 4


def test_each_failed_retry_doubles_the_wait_up_to_its_cap(rig):
    refusing, writer, _, clock, make = rig
    refusing.full = True
    writer.write(make(0))
    waits = []
    for _ in range(4):
        waits.append(writer.health().retry_in_s)
        clock.advance(waits[-1])
        writer.retry()
    assert waits == [1.0, 2.0, 4.0, 4.0] and writer.health().failures_total == 5


def test_a_full_backlog_drops_its_oldest_batch_and_counts_it(store, origin):
    refusing = RefusingStore(store)
    size = batch_bytes(batch(origin, 0))
    writer = StoreWriter(refusing, lambda stored: None, backlog_bytes=2 * size, clock=FixedClock(0.0))
    refusing.full = True
    for sequence in range(4):
        writer.write(batch(origin, sequence))
    assert writer.health().backlog_batches == 2 and writer.dropped_batches_total == 2
    refusing.full = False
    writer.retry(now=True)
    assert stored_sequences(store) == [2, 3]  # the newest kept


def test_a_stop_makes_one_last_attempt_and_counts_what_it_could_not_store(rig, store):
    refusing, writer, _, _, make = rig
    refusing.full = True
    writer.write(make(0))
    writer.write(make(1))
    assert writer.close() == 2 and writer.dropped_batches_total == 2
    refusing.full = False
    assert writer.write(make(2)) is None and writer.dropped_batches_total == 3  # after the stop
    assert stored_sequences(store) == []


def test_a_stop_stores_the_backlog_when_the_store_takes_it_again(rig, store):
    refusing, writer, _, _, make = rig
    refusing.full = True
    writer.write(make(0))
    refusing.full = False
    assert writer.close() == 0 and stored_sequences(store) == [0]


# ---------------------------------------------------------------------- the runner's stop

class QueueTap:
    """A tap holding ``queued`` batches: polls take one at a time, drain takes up to
    ``drain_takes`` and reports the rest unread; records which thread did what."""

    name = "fake://queue"
    poll_every_s = 0.0

    def __init__(self, queued: int, drain_takes: int):
        self.stats = type("Stats", (), {})()
        self.queued, self.drain_takes, self.delivered = queued, drain_takes, 0
        self.calls: list[tuple[str, str]] = []
        self.polled = threading.Event()

    def _record(self, what: str) -> None:
        self.calls.append((what, threading.current_thread().name))

    def open(self):
        self._record("open")
        return ["fake://queue:1234"]

    def poll(self, timeout_s):
        self.polled.set()
        return 0

    def drain(self, timeout_s):
        self._record("drain")
        taken = min(self.queued, self.drain_takes)
        self.delivered += taken
        self.queued -= taken
        return self.queued

    def close(self):
        self._record("close")


def test_the_polling_thread_drains_its_tap_before_it_closes_it():
    tap = QueueTap(queued=10, drain_takes=10)
    runner = TapRunner(tap)
    runner.open()
    runner.start()
    assert tap.polled.wait(10)
    assert runner.stop(grace_s=5.0) == 0 and tap.delivered == 10
    assert [what for what, _ in tap.calls] == ["open", "drain", "close"]
    assert tap.calls[1][1] == tap.calls[2][1] == f"kvtier-tap {tap.name}"  # never under a poll
    assert runner.health().state == "stopped" and runner.health().endpoints == ("fake://queue:1234",)


def test_what_a_tap_could_not_take_within_the_grace_is_counted():
    tap = QueueTap(queued=10, drain_takes=4)
    runner = TapRunner(tap)
    runner.open()
    assert runner.stop(grace_s=0.0) == 6 and runner.unread_batches == 6


# ---------------------------------------------------------------------- DuckDB invalidated

REOPEN = textwrap.dedent("""
    import resource, signal, sys
    import duckdb
    from kvtier.collector.batch import EventBatch
    from kvtier.collector.events import Origin, RequestRecord
    from kvtier.collector.store import TraceStore

    origin = Origin("reference", "node-1", "test")
    def batch(seq):
        return EventBatch.from_rows(origin, seq, requests=[
            RequestRecord(f"r{seq}-{i}", 1.0, 64) for i in range(200)])

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    store = TraceStore(sys.argv[1])
    store.ingest(batch(0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))
    try:
        store.run_locked(lambda con: con.execute("CHECKPOINT"))
    except duckdb.FatalException:
        print("invalidated")
    try:  # opened again first; whether this write fits under the limit depends on the file
        print("batch 1:", store.ingest(batch(1)).requests)
    except Exception:  # DuckDB's own error types
        print("batch 1: refused")
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("stored", store.ingest(batch(2)).requests, store.count("ingested_batches"))
""")


def test_the_store_opens_its_file_again_after_duckdb_invalidated_it(tmp_path):
    result = subprocess.run([sys.executable, "-c", REOPEN, str(tmp_path / "s.duckdb")],
                            capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "invalidated" and lines[1] in ("batch 1: 200", "batch 1: refused")
    stored_1 = lines[1] == "batch 1: 200"
    assert lines[2] == f"stored 200 {2 + stored_1}"  # batch 0 came back from the WAL
    assert "opened again after DuckDB invalidated it" in result.stderr
