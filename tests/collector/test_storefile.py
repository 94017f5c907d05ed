"""Opening store files: read-only leaves them byte-identical, writers never adopt a foreign
database, older stores are migrated only by writers, and a lock names its holder."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord
from kvtier.collector.reader import SegmentReader, StoreReader, open_store
from kvtier.collector.segments import export_segments, segments_note
from kvtier.collector.store import TraceStore
from kvtier.collector.storefile import NotAStoreError, StoreLockedError, StoreSchemaError

pytestmark = pytest.mark.timeout(60)
ORIGIN = Origin("reference", "node-1", "storefile-test")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_store(path: Path, requests: int = 3) -> Path:
    with TraceStore(path) as store:
        for k in range(requests):
            events = [BlockEvent(1_800_000_000.0 + k, Outcome.RECOMPUTE_MISS, 100 + k, request_id=f"r{k}",
                                 position=0, tokens=16)]
            store.ingest(EventBatch.from_rows(ORIGIN, k, events,
                                              [RequestRecord(f"r{k}", 1_800_000_000.0 + k, 16,
                                                             block_hashes=(100 + k,))]))
    return path


def test_read_only_reads_and_leaves_the_file_byte_identical(tmp_path):
    path = make_store(tmp_path / "kvtier.duckdb")
    before = digest(path)
    with TraceStore(path, read_only=True, clock=lambda: 1_900_000_000.0) as store:
        assert [r.request_id for r in StoreReader(store).requests()] == ["r0", "r1", "r2"]
        assert store.count_older(0).requests == 3
        with pytest.raises(PermissionError, match="read-only"):
            store.prune(0)
    assert digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["kvtier.duckdb"]


def test_an_immutable_store_opens_read_only(tmp_path):
    path = make_store(tmp_path / "kvtier.duckdb")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        if os.geteuid() == 0:
            pytest.skip("chattr +i is not available here (needs root on ext4/xfs)")
        path.chmod(0o444)  # an unprivileged user cannot write a 0444 file either
    try:
        with TraceStore(path, read_only=True) as store:
            assert store.count("requests") == 3
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        path.chmod(0o644)


@pytest.mark.parametrize("content, says", [
    (b"", "is an empty file, not a DuckDB store"),
    (b"hello, not a database\n", "is not a DuckDB store"),
])
def test_files_that_are_not_duckdb_are_refused_by_readers_and_writers(tmp_path, content, says):
    path = tmp_path / "bogus.duckdb"
    path.write_bytes(content)
    for read_only in (True, False):
        with pytest.raises(NotAStoreError, match=says):
            TraceStore(path, read_only=read_only)
    assert path.read_bytes() == content


def test_a_truncated_store_is_refused(tmp_path):
    whole = make_store(tmp_path / "whole.duckdb").read_bytes()
    path = tmp_path / "cut.duckdb"
    path.write_bytes(whole[:8192])
    with pytest.raises(NotAStoreError, match="truncated"):
        TraceStore(path, read_only=True)


def test_someone_elses_duckdb_file_is_never_adopted(tmp_path):
    path = tmp_path / "invoices.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE invoices (id INTEGER, amount DOUBLE)")
    con.execute("INSERT INTO invoices VALUES (1, 9.5)")
    con.close()
    before = digest(path)
    for read_only in (True, False):
        with pytest.raises(NotAStoreError, match=r"not a kvtier store \(it holds invoices\)"):
            TraceStore(path, read_only=read_only)
    assert digest(path) == before


def test_an_empty_duckdb_file_is_given_the_schema_by_a_writer_only(tmp_path):
    path = tmp_path / "empty.duckdb"
    duckdb.connect(str(path)).close()
    with pytest.raises(NotAStoreError, match="holds no tables"):
        TraceStore(path, read_only=True)
    with TraceStore(path) as store:
        assert store.count("requests") == 0


def test_tables_named_like_kvtiers_with_other_columns_are_another_schema(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE requests (arrival_s DOUBLE, request_id VARCHAR)")
    con.close()
    before = digest(path)
    for read_only in (True, False):
        with pytest.raises(StoreSchemaError, match="another schema"):
            TraceStore(path, read_only=read_only)
    assert digest(path) == before


def older_store(tmp_path) -> Path:
    """A store as an older kvtier wrote it: the requests table without the newest columns, no
    metric_intervals table."""
    path = make_store(tmp_path / "old.duckdb")
    con = duckdb.connect(str(path))
    con.execute("DROP VIEW requests_with_origin")
    con.execute("DROP VIEW metric_intervals_with_origin")
    con.execute("DROP TABLE metric_intervals")
    for column in ("finish_status", "stop_reason", "model", "client_request_id"):
        con.execute(f"ALTER TABLE requests DROP COLUMN {column}")
    con.execute("CREATE VIEW requests_with_origin AS SELECT t.*, b.engine, b.instance, b.source, "
                "b.sequence FROM requests t JOIN ingested_batches b USING (batch_id)")
    con.close()
    return path


def test_an_older_store_is_refused_read_only_and_migrated_by_a_writer(tmp_path):
    path = older_store(tmp_path)
    before = digest(path)
    with pytest.raises(StoreSchemaError, match=f"older kvtier .*kvtier store migrate {path}"):
        TraceStore(path, read_only=True)
    with pytest.raises(StoreSchemaError, match="older kvtier"):
        TraceStore(path, migrate=False)
    assert digest(path) == before
    with TraceStore(path) as store:  # a writer adds the columns and tables, keeps every row
        assert store.count("requests") == 3
        assert store.count("metric_intervals") == 0
    with TraceStore(path, read_only=True) as store:
        records = list(StoreReader(store).requests())
    assert [r.request_id for r in records] == ["r0", "r1", "r2"]
    assert {r.finish_status for r in records} == {None}


def hold(path: Path) -> subprocess.Popen:
    """Another process that holds DuckDB's write lock on ``path``."""
    proc = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
        "time.sleep(60)"), str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_locked_store_names_its_holder_and_is_read_through_its_segments(tmp_path):
    path = make_store(tmp_path / "store" / "kvtier.duckdb")
    with TraceStore(path) as store:
        export_segments(store, tmp_path / "elsewhere")
    holder = hold(path)
    try:
        with pytest.raises(StoreLockedError, match=f"locked by process {holder.pid}") as locked:
            TraceStore(path)
        assert locked.value.pid == holder.pid
        with pytest.raises(StoreLockedError, match="pass its Parquet segments instead"):
            open_store(path)  # nothing says where its segments are
        segments_note(path, tmp_path / "elsewhere")  # what a running collector writes
        reader = open_store(path)
        assert isinstance(reader, SegmentReader) and reader.root == (tmp_path / "elsewhere").resolve()
        assert f"held by process {holder.pid}" in reader.note and "Parquet segments" in reader.note
        assert [r.request_id for r in reader.requests()] == ["r0", "r1", "r2"]
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    reader = open_store(path)
    assert isinstance(reader, StoreReader)  # unlocked: the store itself
    reader.store.close()
