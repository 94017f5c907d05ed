"""A damaged store is said to be damaged, and never costs a tap what waits in its socket.

DuckDB opens a store file cut short and answers from its catalog (tables, row counts) until a
query reaches a block past the end; a block whose bytes changed fails its checksum only when
read. Each store here is a real DuckDB file written by kvtier, then cut or overwritten.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import duckdb
import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord
from kvtier.collector.hooks_tap import HooksTap, HooksTapConfig
from kvtier.collector.shipper import Shipper, ShipperConfig
from kvtier.collector.store import TraceStore
from kvtier.collector.storefile import StoreDamagedError
from kvtier.collector.taps import Backoff, TapRunner
from tests.collector.test_shipper import record_requests, recorder

pytestmark = pytest.mark.timeout(60)
ORIGIN = Origin("vllm", "engine-a", "vllm-hooks:engine-a:1")  # the shipper's kind of source
_BLOCKS_START = 3 * 4096  # DuckDB's main header and two database headers


def written_store(path: Path, batches: int = 40) -> Path:
    """A store kvtier wrote: ``batches`` batches of block events and request records."""
    with TraceStore(path) as store:
        for k in range(batches):
            rows = [BlockEvent(1_800_000_000.0 + k, Outcome.RECOMPUTE_MISS, 100 + k,
                               request_id=f"r{k}", position=0, tokens=16)]
            store.ingest(EventBatch.from_rows(ORIGIN, k, rows, [RequestRecord(
                f"r{k}", 1_800_000_000.0 + k, 16, block_hashes=(100 + k,))]))
    return path


def cut_point(path: Path) -> int:
    """The shortest whole-block length of ``path`` at which DuckDB still opens it and counts
    the ledger from its catalog, while reading the ledger's rows fails: the damage DuckDB
    does not report at open."""
    whole = path.read_bytes()
    probe = path.with_name("probe.duckdb")
    with duckdb.connect(str(path), read_only=True) as con:
        block_bytes, blocks = con.execute("SELECT block_size, total_blocks FROM pragma_database_size()").fetchone()
    for kept in range(1, blocks):
        probe.write_bytes(whole[:_BLOCKS_START + kept * block_bytes])
        try:
            with duckdb.connect(str(probe), read_only=True) as con:
                counted = con.execute("SELECT count(*) FROM ingested_batches").fetchone()[0]
                try:
                    con.execute("SELECT * FROM ingested_batches").fetchall()
                except duckdb.Error:
                    probe.unlink()
                    return _BLOCKS_START + kept * block_bytes if counted else 0
        except duckdb.Error:
            continue
    raise AssertionError(f"no cut of {path} opens with its ledger unreadable")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_store_cut_short_is_refused_by_readers_and_writers_and_left_as_it_was(tmp_path):
    path = written_store(tmp_path / "kvtier.duckdb")
    size = path.stat().st_size
    cut = cut_point(path)
    os.truncate(path, cut)
    before = digest(path)
    for read_only in (True, False):
        with pytest.raises(StoreDamagedError) as refused:
            TraceStore(path, read_only=read_only)
        assert str(refused.value) == (
            f"{path} is damaged (cut short: it holds {cut:,} bytes of the {size:,} its header "
            "names); restore it from a copy, or give another path (Parquet segments it exported "
            "keep their rows)")
    assert digest(path) == before  # nothing written into it, nothing added beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvtier.duckdb"]


def test_a_block_failing_its_checksum_is_named_when_a_query_reaches_it(tmp_path):
    path = written_store(tmp_path / "kvtier.duckdb")
    with duckdb.connect(str(path), read_only=True) as con:
        (block,) = con.execute("SELECT DISTINCT block_id FROM pragma_storage_info('requests') "
                               "WHERE block_id >= 0 LIMIT 1").fetchone()
        block_bytes = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]
    at = _BLOCKS_START + block * block_bytes
    with open(path, "r+b") as file:  # a few bytes of the block's data change on disk
        file.seek(at + 64)
        file.write(b"\x5a" * 64)
    with TraceStore(path, read_only=True) as store:
        assert store.count("block_events") == 40  # the rest of the store still reads
        with pytest.raises(StoreDamagedError, match=rf"^{path} is damaged \(a block fails "
                                                    rf"DuckDB's checksum at byte {at:,}\)"):
            store.query("SELECT * FROM requests")
        assert store.damage is not None


def test_a_store_that_cannot_be_read_never_costs_a_tap_what_waits_in_its_socket(tmp_path):
    """The hooks tap asks the store where a new stream left off; when that read fails, the
    tap's supervisor keeps its socket open, and every batch already sent is delivered."""
    path = written_store(tmp_path / "kvtier.duckdb")
    cut = cut_point(path)
    delivered = []
    with TraceStore(path) as store:
        os.truncate(path, cut)  # damaged under the running store: its ledger is past the end
        tap = HooksTap(HooksTapConfig(("tcp://127.0.0.1:0",)), delivered.append,
                       resume=store.next_sequence)
        runner = TapRunner(tap, backoff=Backoff(initial_s=0.01, max_s=0.01))
        runner.open()
        shipper = Shipper(ShipperConfig(runner.endpoints[0], interval_s=3600.0, queue_batches=50))
        rec = recorder("engine-d")
        shipper.add(rec)
        try:
            for i in range(20):
                record_requests(rec, 2, start=2 * i)
                assert shipper.ship_pending(deadline=time.monotonic() + 30) == 1
            deadline = time.monotonic() + 30
            while len(delivered) < 20 and time.monotonic() < deadline:
                runner.step()
        finally:
            shipper.close()
            runner.stop(grace_s=1.0)
    assert [batch.sequence for batch in delivered] == list(range(20))
    health = runner.health()
    assert health.failures_total >= 1 and "is damaged" in health.last_error
    assert "(its connection is kept)" in health.last_error


def test_a_write_into_a_store_cut_under_it_names_the_damage_single_or_grouped(tmp_path):
    """The ledger read that starts a write meets the cut first; what the writer reports (and
    /healthz shows) is that damage, never DuckDB's "transaction is aborted" from the clean-up
    after it, for one batch or a group."""
    path = written_store(tmp_path / "kvtier.duckdb")
    cut = cut_point(path)
    other = Origin("vllm", "engine-b", "vllm-hooks:engine-b:1")
    batches = [EventBatch.from_rows(other, s, [BlockEvent(1.0, Outcome.GPU_HIT, 7 + s)])
               for s in range(3)]
    with TraceStore(path) as store:
        os.truncate(path, cut)
        for write in (lambda: store.ingest(batches[0]), lambda: store.ingest_many(batches)):
            with pytest.raises(StoreDamagedError, match=r"is damaged \(cut short at byte"):
                write()
        assert store.damage is not None
