"""Tier moves and per-request fallbacks end to end in the collector: the schema's rules on
records and columns alike, the table and its view, an engine's recorder and shipment (the
moves and its count of dropped control messages), the hooks tap's export, an older store's
migration (a request's new fields migrate as every added column does: test_storefile)."""

from __future__ import annotations

import dataclasses

import duckdb
import pytest

from kvtier.collector import columns, storefile
from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, RequestRecord, schema_fields
from kvtier.collector.hooks_tap import HooksTap, HooksTapConfig
from kvtier.collector.moves import TierMove
from kvtier.collector.recorder import Recorder
from kvtier.collector.shipment import Shipment, decode, encode
from kvtier.collector.store import TraceStore
from kvtier.collector.block_kinds import Tier

FIELDS = [f.name for f in schema_fields(TierMove)]


def move(i: int = 0, **fields) -> TierMove:
    values = dict(time_s=100.0 + i, action="pause", direction="loads", tier=Tier.CPU, actor="rule",
                  mode="act", reason="ttft_p99_over_budget", tier_config_id="gpu+cpu:8;paused=loads:cpu",
                  ttft_p99_s=0.9, itl_p99_s=0.01, budget_s=0.5, command=3)
    values.update(fields)
    return TierMove(**values)


def move_batch(origin: Origin, sequence: int, moves) -> EventBatch:
    table, rejected = columns.rows_to_table(TierMove, moves)
    return EventBatch(origin, sequence, columns.empty_table(BlockEvent),
                      columns.empty_table(RequestRecord), rejected, tier_moves=table)


def test_a_move_round_trips_through_the_table_and_its_view(store, origin):
    records = [move(0), move(1, action="resume", actor="engine", mode=None, reason="lease_expired",
                                ttft_p99_s=None, itl_p99_s=None, budget_s=None)]
    store.ingest(move_batch(origin, 0, records))
    rows = store.query("SELECT * EXCLUDE (batch_id) FROM tier_moves ORDER BY time_s").to_pylist()
    assert rows == [{**dataclasses.asdict(r), "tier": "cpu"} for r in records]
    assert store.query("SELECT DISTINCT instance FROM tier_moves_with_origin").to_pylist() == [
        {"instance": origin.instance}]


@pytest.mark.parametrize("field, value, reason", [
    ("action", "stop", "unknown action"), ("direction", "sideways", "unknown direction"),
    ("actor", "someone", "unknown actor"), ("mode", "maybe", "unknown mode"),
    ("budget_s", -1.0, "negative or NaN budget_s"), ("tier", "tape", "unknown tier")])
def test_a_move_row_outside_the_schema_is_left_out_and_counted(origin, field, value, reason):
    good = dataclasses.asdict(move())
    batch = move_batch(origin, 0, [good, {**good, field: value}])
    assert (batch.tier_moves.num_rows, dict(batch.rejected)) == (1, {reason: 1})
    with pytest.raises(ValueError, match=field):
        move(**{field: value})


def test_a_request_carries_its_fallback_and_an_unknown_reason_is_refused(store, origin):
    record = RequestRecord("r1", 1.0, 512, recomputed_tokens=512, fallback_reason="paused",
                           fallback_tokens=480)
    bad = {**dataclasses.asdict(record), "request_id": "r2", "fallback_reason": "bored"}
    batch = EventBatch.from_rows(origin, 0, requests=[record, bad])
    assert dict(batch.rejected) == {"unknown fallback_reason": 1}
    store.ingest(batch)
    assert store.query("SELECT fallback_reason, fallback_tokens FROM requests").to_pylist() == [
        {"fallback_reason": "paused", "fallback_tokens": 480}]
    with pytest.raises(ValueError, match="fallback_tokens"):
        RequestRecord("r3", 1.0, 5, fallback_tokens=-1)


def test_record_move_takes_the_schemas_fields_in_its_order():
    import inspect

    assert list(inspect.signature(Recorder.record_move).parameters)[1:] == FIELDS


def test_an_engines_moves_and_dropped_control_messages_travel_in_its_shipment(origin, store):
    recorder = Recorder(origin, capacity_moves=2)
    for i in range(3):  # one past the bound
        recorder.record_move(*dataclasses.astuple(move(i, actor="engine", reason="command")))
    recorder.guardrail_rejected.update(unauthorised=4, malformed=1)
    frames = encode(Shipment(recorder.take_packed(), 0, 0))
    assert len(frames) == 5
    shipment = decode(frames)
    assert dict(shipment.packed.guardrail_rejected) == {"unauthorised": 4, "malformed": 1}
    batch = shipment.packed.to_event_batch(0)
    assert batch.tier_moves.column("time_s").to_pylist() == [100.0, 101.0]
    assert recorder.dropped_events == 1
    store.ingest(batch)
    assert store.count("tier_moves") == 2
    # only the count changed: the engine still ships a batch, so an idle engine reports it
    recorder.guardrail_rejected["unauthorised"] = 9
    quiet = recorder.take_packed()
    assert quiet is not None and dict(quiet.guardrail_rejected)["unauthorised"] == 9
    assert len(encode(Shipment(quiet, 1, 0))) == 3
    assert recorder.take_packed() is None  # nothing new


def test_the_hooks_tap_exports_the_engines_largest_count_of_dropped_messages(origin):
    tap = HooksTap(HooksTapConfig(("tcp://127.0.0.1:0",)), lambda batch: None)
    recorder = Recorder(Origin("vllm", "node-1", "vllm-hooks:node-1:1"))
    for sequence, count in enumerate((3, 7, 5)):  # a late, smaller count never lowers it
        recorder.guardrail_rejected["unauthorised"] = count
        recorder._rejections_shipped = {}
        tap._deliver([tap._decoded(encode(Shipment(recorder.take_packed(), sequence, 0)))])
    samples = [s for s in tap.samples() if s.name == "kvtier_guardrail_rejected_messages_total"]
    assert [(s.labels["reason"], s.labels["engine_instance"], s.value) for s in samples] == [
        ("unauthorised", "node-1", 7)]


def test_an_older_store_without_tier_moves_is_migrated_by_a_writer(tmp_path, origin):
    path = tmp_path / "old.duckdb"
    with TraceStore(path) as store:
        store.ingest(EventBatch.from_rows(origin, 0, requests=[RequestRecord("r", 1.0, 64)]))
    con = duckdb.connect(str(path))
    con.execute("DROP VIEW tier_moves_with_origin")
    con.execute("DROP TABLE tier_moves")
    con.close()
    with pytest.raises(storefile.StoreSchemaError, match="older kvtier"):
        TraceStore(path, read_only=True)
    with TraceStore(path) as store:
        assert store.count("tier_moves") == 0
        store.ingest(move_batch(origin, 1, [move(1)]))
        assert store.count("tier_moves") == 1
