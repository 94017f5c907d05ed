"""Parquet segments: immutable, hive-partitioned, readable while another process writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord
from kvtier.collector.reader import SegmentReader, StoreReader
from kvtier.collector.segments import export_segments, segments_relation

WRITER = Path(__file__).with_name("writer_process.py")
DAY_S = 86400.0


def events(instance_day_s, n, request_id):
    return [BlockEvent(instance_day_s + i, Outcome.RECOMPUTE_MISS, 7000 + i, request_id=request_id,
                       position=i) for i in range(n)]


def test_export_partitions_by_day_and_instance_and_never_rewrites(store, tmp_path):
    a, b = Origin("vllm", "node-a", "a"), Origin("vllm", "node/b", "b")
    day1 = 1_800_000_000.0 - (1_800_000_000.0 % DAY_S)
    store.ingest(EventBatch.from_rows(a, 0, events(day1 + 10, 3, "r1")))
    store.ingest(EventBatch.from_rows(b, 0, events(day1 + DAY_S + 10, 2, "r2")))
    first = export_segments(store, tmp_path)
    layout = sorted(str(p.parent.relative_to(tmp_path)) for p in first.files)
    assert layout == ["block_events/day=2027-01-15/instance=node-a",
                      "block_events/day=2027-01-16/instance=node%2Fb"]
    before = {p: p.read_bytes() for p in first.files}

    assert export_segments(store, tmp_path).total_rows == 0  # nothing new
    store.ingest(EventBatch.from_rows(a, 1, events(day1 + 20, 4, "r3")))
    second = export_segments(store, tmp_path)
    assert second.rows == {"block_events": 4, "requests": 0, "metric_intervals": 0,
                           "step_records": 0, "tier_moves": 0}
    assert {p: p.read_bytes() for p in first.files} == before
    assert not set(second.files) & set(first.files)

    con = duckdb.connect()
    counts = con.sql(f"SELECT instance, count(*) FROM {segments_relation(tmp_path, 'block_events')} "
                     "GROUP BY ALL ORDER BY 1").fetchall()
    assert counts == [("node-a", 7), ("node/b", 2)]


def test_another_root_gets_everything(store, tmp_path, origin):
    store.ingest(EventBatch.from_rows(origin, 0, events(1_800_000_000.0, 3, "r")))
    export_segments(store, tmp_path / "one")
    assert export_segments(store, tmp_path / "two").rows["block_events"] == 3


def test_segment_reader_matches_store_reader(store, tmp_path, origin):
    store.ingest(EventBatch.from_rows(origin, 0, events(1_800_000_000.0, 3, "with-events"), [
        RequestRecord("with-events", 1_800_000_001.0, 48, output_tokens=4),
        RequestRecord("with-hashes", 1_800_000_000.0, 32, block_hashes=(11, 12), block_size_tokens=16),
    ]))
    export_segments(store, tmp_path)
    from_store = list(StoreReader(store).requests())
    assert [r.request_id for r in from_store] == ["with-hashes", "with-events"]
    assert from_store[1].block_hashes == (7000, 7001, 7002)  # rebuilt from lookup events
    assert list(SegmentReader(tmp_path).requests()) == from_store


def test_segment_reader_needs_a_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        SegmentReader(tmp_path / "missing")


def test_segments_are_readable_while_a_writer_process_holds_the_store(tmp_path):
    path, root = tmp_path / "live.duckdb", tmp_path / "segments"
    writer = subprocess.Popen([sys.executable, str(WRITER), str(path), "--batches", "20", "--rows", "50",
                               "--segments", str(root), "--hold-s", "30"], stdout=subprocess.PIPE, text=True)
    try:
        for line in writer.stdout:
            if line.strip() == "HOLDING":
                break
        # The store file itself is locked against this process, readers included ...
        with pytest.raises(duckdb.IOException, match="lock"):
            duckdb.connect(str(path), read_only=True)
        # ... but its segments are not.
        records = list(SegmentReader(root).requests())
        assert [r.request_id for r in records] == [f"r{k}" for k in range(20)]
        assert all(len(r.block_hashes) == 50 for r in records)
    finally:
        writer.kill()
        writer.wait(timeout=10)


def test_reused_request_ids_from_two_replays_do_not_mix(store, tmp_path):
    first, second = Origin("simulator", "demo", "run-1"), Origin("simulator", "demo", "run-2")
    store.ingest(EventBatch.from_rows(first, 0, events(1_800_000_000.0, 2, "r"), [RequestRecord("r", 1_800_000_000.0, 32)]))
    store.ingest(EventBatch.from_rows(second, 0, [BlockEvent(1_800_000_100.0, Outcome.GPU_HIT, 9, request_id="r", position=0)],
                                      [RequestRecord("r", 1_800_000_100.0, 16)]))
    export_segments(store, tmp_path)
    for reader in (StoreReader(store), SegmentReader(tmp_path)):
        assert [r.block_hashes for r in reader.requests()] == [(7000, 7001), (9,)]


def test_scraped_metric_intervals_are_exported_as_segments(store, tmp_path):
    from kvtier.collector.events import MetricInterval

    origin = Origin("vllm", "node-a", "vllm-scrape:node-a:http://127.0.0.1:8000/metrics:1")
    day = 1_800_000_000.0
    rows = [MetricInterval(day, day + 10, "vllm:prefix_cache_hits_total", "counter", 60.0,
                           'engine="0"'),
            MetricInterval(day, day + 10, "vllm:kv_cache_usage_perc", "gauge", 0.5, 'engine="0"')]
    store.ingest(EventBatch.from_intervals(origin, 0, rows))
    result = export_segments(store, tmp_path)
    assert result.rows["metric_intervals"] == 2
    got = duckdb.connect().sql(
        f"SELECT instance, metric, value FROM {segments_relation(tmp_path, 'metric_intervals')} "
        "ORDER BY metric").fetchall()
    assert got == [("node-a", "vllm:kv_cache_usage_perc", 0.5),
                   ("node-a", "vllm:prefix_cache_hits_total", 60.0)]

