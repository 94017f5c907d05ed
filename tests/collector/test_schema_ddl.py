"""The DuckDB tables follow the event schema, field by field."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.block_kinds import block_hash_from_bytes
from kvtier.collector.events import (
    BlockEvent, MetricInterval, Outcome, RequestRecord, StepRecord, Tier,
)

TABLES = [(BlockEvent, "block_events"), (RequestRecord, "requests"),
          (MetricInterval, "metric_intervals"), (StepRecord, "step_records")]

EXPECTED_SQL = {float: "DOUBLE", int: "BIGINT", str: "VARCHAR", Tier: "ENUM('gpu', 'cpu', 'cold')"}


def described(store, table):
    return {row["column_name"]: row for row in store.query(f"DESCRIBE {table}").to_pylist()}


@pytest.mark.parametrize("record_type, table", TABLES)
def test_every_schema_field_is_a_column_in_order(store, record_type, table):
    columns = list(described(store, table))
    fields = [f.name for f in dataclasses.fields(record_type)]
    assert columns == fields + ["batch_id"]


@pytest.mark.parametrize("record_type, table", TABLES)
def test_column_types_and_nullability_follow_annotations(store, record_type, table):
    columns = described(store, table)
    hints = typing.get_type_hints(record_type)
    for f in dataclasses.fields(record_type):
        column = columns[f.name]
        optional = type(None) in typing.get_args(hints[f.name])
        assert (column["null"] == "YES") == optional, f.name
        base = next((a for a in typing.get_args(hints[f.name]) if a is not type(None)), hints[f.name])
        if "sql" in f.metadata:
            assert column["column_type"] == f.metadata["sql"], f.name
        elif base is Outcome:
            assert column["column_type"].startswith("ENUM('gpu_hit', 'cpu_promotion'"), f.name
        else:
            assert column["column_type"] == EXPECTED_SQL[base], f.name


def test_enum_types_list_every_member(store):
    tiers = store.scalar("SELECT enum_range(NULL::tier)")
    outcomes = store.scalar("SELECT enum_range(NULL::outcome)")
    assert tiers == [t.label for t in Tier]
    assert outcomes == [o.label for o in Outcome]


def test_full_block_event_round_trips_through_the_store(store, origin):
    event = BlockEvent(time_s=1_800_000_000.25, kind=Outcome.COLD_PROMOTION, block_hash=2**64 - 1,
                       request_id="cmpl-1", parent_hash=42, position=3, tokens=16, size_bytes=1 << 20,
                       tier_from=Tier.COLD, tier_to=Tier.GPU, priority=80, latency_s=0.0125)
    store.ingest(EventBatch.from_rows(origin, 0, [event]))
    row = store.query("SELECT * EXCLUDE (batch_id) FROM block_events").to_pylist()[0]
    expected = dataclasses.asdict(event)
    expected.update(kind="cold_promotion", tier_from="cold", tier_to="gpu")
    assert row == expected


def test_request_record_round_trips_through_the_store(store, origin):
    record = RequestRecord(request_id="r1", arrival_s=5.0, prompt_tokens=1000, output_tokens=20,
                           block_hashes=(1, 2, 2**63), block_size_tokens=512, gpu_hit_tokens=512,
                           cpu_promotion_tokens=0, cold_promotion_tokens=0, recomputed_tokens=488,
                           ttft_s=0.2, itl_s=0.01, e2e_latency_s=0.5, tier_config_id="gpu-only",
                           session_id="s", parent_request_id="r0", request_type="text", turn=2,
                           finish_status="stopped", stop_reason="tool_use", model="llama-8b",
                           client_request_id="chatcmpl-r1")
    store.ingest(EventBatch.from_rows(origin, 0, requests=[record]))
    row = store.query("SELECT * EXCLUDE (batch_id) FROM requests").to_pylist()[0]
    row["block_hashes"] = tuple(row["block_hashes"])
    assert row == dataclasses.asdict(record)


def test_schema_validation_names_the_bad_field():
    with pytest.raises(ValueError, match="latency_s"):
        BlockEvent(0.0, Outcome.GPU_HIT, 1, latency_s=-0.1)
    with pytest.raises(ValueError, match="priority"):
        BlockEvent(0.0, Outcome.PRIORITY_UPDATE, 1, priority=101)
    with pytest.raises(ValueError, match="block_hash"):
        BlockEvent(0.0, Outcome.GPU_HIT, 2**64)
    with pytest.raises(ValueError, match="finish_status must be one of stopped, length, aborted, error"):
        RequestRecord("r", 0.0, 10, finish_status="tool_use")


def test_byte_hashes_fold_like_vllm():
    digest = bytes(range(32))
    assert block_hash_from_bytes(digest) == int.from_bytes(digest, "big") & (2**64 - 1)


def test_a_request_row_with_an_unknown_finish_status_is_rejected_and_counted(store, origin):
    rows = [{"request_id": "ok", "arrival_s": 1.0, "prompt_tokens": 5, "block_hashes": (),
             "finish_status": "length"},
            {"request_id": "bad", "arrival_s": 2.0, "prompt_tokens": 5, "block_hashes": (),
             "finish_status": "done"}]
    result = store.ingest(EventBatch.from_rows(origin, 0, requests=rows))
    assert (result.requests, dict(result.rejected)) == (1, {"unknown finish_status": 1})
    assert store.scalar("SELECT finish_status FROM requests") == "length"


def test_metric_intervals_round_trip_and_bad_ones_are_counted(store, origin):
    good = MetricInterval(100.0, 110.0, "vllm:prefix_cache_hits_total", "counter", 60.0,
                          'engine="0",model_name="m"')
    histogram = MetricInterval(100.0, 110.0, "vllm:time_to_first_token_seconds", "histogram", 6.0,
                               sum_value=2.0, reset=1)
    bad = {"start_s": 110.0, "end_s": 100.0, "metric": "m", "kind": "counter", "value": 1.0, "labels": ""}
    odd = {"start_s": 100.0, "end_s": 110.0, "metric": "m", "kind": "summary", "value": 1.0, "labels": ""}
    batch = EventBatch.from_intervals(origin, 0, [good, histogram, bad, odd])
    assert dict(batch.rejected) == {"end_s before start_s": 1, "unknown metric kind": 1}
    assert store.ingest(batch).metric_intervals == 2
    rows = store.query("SELECT * EXCLUDE (batch_id) FROM metric_intervals ORDER BY kind").to_pylist()
    assert rows == [dataclasses.asdict(good), dataclasses.asdict(histogram)]
    assert store.scalar("SELECT count(*) FROM metric_intervals_with_origin WHERE engine = ?",
                        [origin.engine]) == 2

