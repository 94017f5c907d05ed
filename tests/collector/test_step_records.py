"""Step records end to end in the collector: the registry, the table and view, rejections,
the recorder's bound, the shipment, an older store's migration, segments and the reader."""

from __future__ import annotations

import dataclasses
import time

import duckdb
import pytest

from kvtier.collector import columns, ddl, segments, storefile
from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, RequestRecord, StepRecord, schema_fields
from kvtier.collector.hooks_tap import HooksTap, HooksTapConfig
from kvtier.collector.record_types import RECORD_TABLES, TABLE_NAMES, record_table
from kvtier.collector.recorder import Recorder
from kvtier.collector.segments import export_segments
from kvtier.collector.shipment import Shipment, decode, encode
from kvtier.collector.shipper import Shipper, ShipperConfig
from kvtier.collector.step_records import read_step_records
from kvtier.collector.store import TraceStore
from kvtier.collector.summary import segments_summary, store_summary
from kvtier.collector.taps import TapRunner
from tests.conftest import ANY_PORT

FIELDS = [f.name for f in schema_fields(StepRecord)]


def step_batch(origin: Origin, sequence: int, steps) -> EventBatch:
    """A batch of ``StepRecord`` values (or dicts of their fields), malformed ones left out and
    counted, as an engine's shipment brings them."""
    table, rejected = columns.rows_to_table(StepRecord, steps)
    return EventBatch(origin, sequence, columns.empty_table(BlockEvent),
                      columns.empty_table(RequestRecord), rejected, step_records=table)


def step(i: int, **fields) -> StepRecord:
    values = dict(time_s=100.0 + i, step=i, duration_s=0.02, prefill_tokens=64, prefill_requests=1,
                  prefill_context_tokens=32, cached_tokens=32, decode_requests=2,
                  decode_context_tokens=300, running_requests=3, waiting_requests=1,
                  preempted_requests=0, loaded_bytes=8192, stored_bytes=4096)
    values.update(fields)
    return StepRecord(**values)


def test_every_module_reads_one_registry_of_record_types():
    assert TABLE_NAMES == ("block_events", "requests", "metric_intervals", "step_records",
                           "tier_moves")
    assert tuple(ddl.TABLE_COLUMNS) == TABLE_NAMES == segments.SEGMENT_TABLES
    assert ddl.TIME_COLUMN == {e.table: e.time_column for e in RECORD_TABLES}
    assert set(storefile.KVTIER_TABLES) >= set(TABLE_NAMES)
    assert set(EventBatch.empty(Origin("e", "i", "s"), 0).tables()) == set(TABLE_NAMES)
    assert columns.columns_of(StepRecord) is ddl.TABLE_COLUMNS["step_records"]
    with pytest.raises(ValueError, match="not a stored record type; known: BlockEvent"):
        record_table(Origin)


def test_step_records_round_trip_through_table_and_view(store, origin):
    records = [step(0), step(1, duration_s=None, prefill_tokens=0, prefill_requests=0)]
    result = store.ingest(step_batch(origin, 0, records))
    assert (result.step_records, result.stored, dict(result.rejected)) == (2, 2, {})
    rows = store.query("SELECT * EXCLUDE (batch_id) FROM step_records ORDER BY step").to_pylist()
    assert rows == [dataclasses.asdict(r) for r in records]
    view = store.query("SELECT engine, instance, source, sequence FROM step_records_with_origin")
    assert set(map(tuple, (r.values() for r in view.to_pylist()))) == {
        (origin.engine, origin.instance, origin.source, 0)}
    assert store.ingest(step_batch(origin, 0, records)).duplicate  # the ledger


def test_malformed_step_rows_are_left_out_and_counted(store, origin):
    good = dataclasses.asdict(step(0))
    rows = [good, {**good, "prefill_tokens": -1}, {**good, "prefill_requests": 0},
            {**good, "time_s": float("inf")}, {**good, "step": "seven"}]
    batch = step_batch(origin, 0, rows)
    assert dict(batch.rejected) == {"negative or NaN prefill_tokens": 1,
                                    "prefill_tokens over no prefill_requests": 1,
                                    "time_s not finite": 1, "wrong type for step": 1}
    assert store.ingest(batch).step_records == 1


def test_prune_and_count_older_cover_step_records(store, origin, clock):
    store.ingest(step_batch(origin, 0, [step(0, time_s=clock.now_s - 100),
                                                   step(1, time_s=clock.now_s)]))
    assert store.count_older(50).step_records == 1
    assert store.prune(50).step_records == 1
    assert store.count("step_records") == 1


def test_the_recorder_keeps_steps_up_to_its_bound_and_counts_the_rest(origin):
    recorder = Recorder(origin, capacity_steps=2)
    for i in range(5):
        recorder.record_step(100.0 + i, i, 0.01, prefill_tokens=8, prefill_requests=1)
    assert recorder.dropped_steps == 3
    batch = recorder.take_events()
    assert batch.step_records.column("step").to_pylist() == [0, 1]
    recorder.record_step(200.0, 5)  # room again after the drain
    assert recorder.take_events().step_records.column("step").to_pylist() == [5]
    assert recorder.dropped_steps == 3 and recorder.take_events() is None


def test_record_step_takes_the_schemas_fields_in_its_order():
    import inspect

    assert list(inspect.signature(Recorder.record_step).parameters)[1:] == FIELDS


def test_a_shipment_carries_steps_and_their_drop_count(origin):
    recorder = Recorder(origin)
    recorder.record_step(*dataclasses.astuple(step(0)))
    recorder.record_step(*dataclasses.astuple(step(1, duration_s=None)))
    frames = encode(Shipment(recorder.take_packed(), 4, 0, dropped_steps_total=7))
    assert len(frames) == 4
    shipment = decode(frames)
    assert shipment.dropped_steps_total == 7
    rows = shipment.packed.to_event_batch(4).step_records.to_pylist()
    assert rows == [dataclasses.asdict(step(0)), dataclasses.asdict(step(1, duration_s=None))]


def test_a_shipment_without_steps_keeps_three_frames(origin):
    recorder = Recorder(origin)
    recorder.record(0, 1)
    frames = encode(Shipment(recorder.take_packed(), 0, 0))
    assert len(frames) == 3 and decode(frames).packed.steps == ()


def test_shipped_steps_reach_the_store_once_per_sequence_and_drops_are_counted(store):
    tap = HooksTap(HooksTapConfig((ANY_PORT,)), store.ingest, resume=store.next_sequence)
    runner = TapRunner(tap)
    runner.open()
    (where,) = runner.endpoints  # the port bound for :0
    runner.start()
    recorder = Recorder(Origin("vllm", "node-1", "vllm-hooks:node-1:1"), capacity_steps=3)
    shipper = Shipper(ShipperConfig(where, interval_s=0.05))
    try:
        time.sleep(0.3)  # the PUSH socket connects
        for i in range(5):  # two past the bound
            recorder.record_step(100.0 + i, i, 0.01)
        shipper.add(recorder)
        deadline = time.monotonic() + 10
        while store.count("step_records") < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        shipper.close()
        runner.stop()
    assert store.query("SELECT step FROM step_records ORDER BY step").column(0).to_pylist() == [0, 1, 2]
    samples = {s.name: s.value for s in tap.samples()}
    assert samples["kvtier_recorder_dropped_steps_total"] == 2
    assert tap.stats.step_records == 3


def test_an_older_store_without_step_records_is_migrated_by_a_writer(tmp_path, origin):
    path = tmp_path / "old.duckdb"
    with TraceStore(path) as store:
        store.ingest(step_batch(origin, 0, [step(0)]))
    con = duckdb.connect(str(path))
    con.execute("DROP VIEW step_records_with_origin")
    con.execute("DROP TABLE step_records")
    con.close()
    with pytest.raises(storefile.StoreSchemaError, match="older kvtier"):
        TraceStore(path, read_only=True)
    with TraceStore(path) as store:
        assert store.count("step_records") == 0
        store.ingest(step_batch(origin, 1, [step(1)]))
    assert [t.column("step").to_pylist() for t in read_step_records(path).values()] == [[1]]


def test_the_reader_gives_columns_per_instance_from_a_store_and_its_segments(tmp_path, clock):
    a, b = Origin("vllm", "node-a", "hooks:a"), Origin("refengine", "node-b", "hooks:b")
    with TraceStore(tmp_path / "s.duckdb", clock=clock) as store:
        store.ingest(step_batch(a, 0, [step(1), step(0)]))
        store.ingest(step_batch(b, 0, [step(0, prefill_tokens=7)]))
        live = read_step_records(store)
        export_segments(store, tmp_path / "segments")
        assert store_summary(store)["step_records"] == 3
    assert segments_summary(tmp_path / "segments")["step_records"] == 3
    from_file = read_step_records(tmp_path / "s.duckdb")
    from_segments = read_step_records(tmp_path / "segments")
    for tables in (live, from_file, from_segments):
        assert list(tables) == ["node-a", "node-b"]
        assert tables["node-a"].column("step").to_pylist() == [0, 1]  # by time
        assert tables["node-b"].column("prefill_tokens").to_numpy().tolist() == [7]
        assert tables["node-a"].column_names == ["source", *FIELDS]
    assert list(read_step_records(tmp_path / "segments", instance="node-b")) == ["node-b"]
    assert read_step_records(TraceStore(":memory:")) == {}
