"""The flusher moves batches to the store in the background and retries failures idempotently."""

from __future__ import annotations

from kvtier.collector.events import Outcome
from kvtier.collector.flusher import Flusher
from kvtier.collector.recorder import Recorder
from kvtier.collector.store import TraceStore


def test_background_flusher_stores_everything_by_stop(origin, file_store):
    recorder = Recorder(origin)
    seen = []
    with Flusher(recorder, file_store, interval_s=0.01, on_ingest=lambda batch, result: seen.append(result)):
        for i in range(10_000):
            recorder.record(Outcome.GPU_HIT, i)
    assert file_store.count("block_events") == 10_000
    assert sum(result.block_events for result in seen) == 10_000
    assert recorder.take_packed() is None  # nothing left behind


class FailingOnce(TraceStore):
    """A real store whose first ingest fails, as a full disk would."""

    failed = False

    def ingest(self, batch):
        if not self.failed:
            self.failed = True
            raise OSError("No space left on device")
        return super().ingest(batch)


def test_failed_batch_is_retried_with_the_same_sequence(origin, clock):
    store = FailingOnce(":memory:", clock=clock)
    recorder = Recorder(origin)
    flusher = Flusher(recorder, store)
    recorder.record(Outcome.STORE, 1)
    assert flusher.flush() == 0 and flusher.failures == 1
    recorder.record(Outcome.STORE, 2)
    assert flusher.flush() == 2
    ledger = store.query("SELECT sequence, block_events FROM ingested_batches ORDER BY sequence").to_pylist()
    assert ledger == [{"sequence": 0, "block_events": 1}, {"sequence": 1, "block_events": 1}]
    store.close()


class FailingThrice(TraceStore):
    """A real store whose first three ingests fail: a disk full for a while."""

    failures_left = 3

    def ingest(self, batch):
        if self.failures_left:
            self.failures_left -= 1
            raise OSError(28, "No space left on device")
        return super().ingest(batch)


def test_a_store_that_keeps_failing_is_one_line_per_outage_without_a_traceback(origin, clock, caplog):
    store = FailingThrice(":memory:", clock=clock)
    recorder = Recorder(origin)
    flusher = Flusher(recorder, store)
    recorder.record(Outcome.STORE, 1)
    for _ in range(3):
        assert flusher.flush() == 0
    assert flusher.flush() == 1 and store.count("block_events") == 1
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "No space left on device" in said[0] and "again" in said[1]
    assert not [r for r in caplog.records if r.exc_info]
    store.close()


def test_a_failing_hook_does_not_stop_the_flusher(origin, store):
    recorder = Recorder(origin)

    def broken(batch, result):
        raise RuntimeError("exporter down")

    flusher = Flusher(recorder, store, on_ingest=broken)
    recorder.record(Outcome.GPU_HIT, 1)
    flusher.flush()
    recorder.record(Outcome.GPU_HIT, 2)
    flusher.flush()
    assert store.count("block_events") == 2


class SlowFirstIngest(TraceStore):
    """A real store whose first ingest waits until the test lets it go, counting calls."""

    def __init__(self, *args, **kwargs):
        import threading

        super().__init__(*args, **kwargs)
        self.entered, self.release, self.calls = threading.Event(), threading.Event(), []

    def ingest(self, batch):
        self.calls.append(batch.sequence)
        if len(self.calls) == 1:
            self.entered.set()
            self.release.wait(10)
        return super().ingest(batch)


def test_a_flush_waits_for_one_already_running_instead_of_sharing_its_batch(origin, clock):
    import threading

    store = SlowFirstIngest(":memory:", clock=clock)
    recorder = Recorder(origin)
    flusher = Flusher(recorder, store)
    recorder.record(Outcome.GPU_HIT, 1)
    background = threading.Thread(target=flusher.flush)
    background.start()
    assert store.entered.wait(10)
    recorder.record(Outcome.GPU_HIT, 2)
    caller = threading.Thread(target=flusher.flush)
    caller.start()
    caller.join(0.2)
    assert caller.is_alive()  # blocked behind the running flush, not re-sending its batch
    store.release.set()
    background.join(10)
    caller.join(10)
    assert store.calls == [0, 1]
    assert store.count("block_events") == 2
    store.close()
