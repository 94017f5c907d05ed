"""kill -9 in the middle of ingest: nothing acknowledged is lost, nothing is duplicated."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from kvtier.collector.store import TraceStore

WRITER = Path(__file__).with_name("writer_process.py")
BATCHES, ROWS = 150, 1000


def start_writer(store_path, *extra):
    return subprocess.Popen([sys.executable, str(WRITER), str(store_path), "--batches", str(BATCHES),
                             "--rows", str(ROWS), *extra], stdout=subprocess.PIPE, text=True)


def test_kill_9_mid_ingest_then_replay_loses_and_duplicates_nothing(tmp_path):
    path = tmp_path / "crash.duckdb"
    writer = start_writer(path)
    acked = []
    for line in writer.stdout:
        acked.append(int(line.split()[1]))
        if len(acked) == 25:
            writer.send_signal(signal.SIGKILL)
            break
    writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL

    with TraceStore(path) as store:
        rows = store.query("SELECT sequence, count(*) AS n FROM block_events_with_origin GROUP BY sequence")
        per_batch = {row["sequence"]: row["n"] for row in rows.to_pylist()}
    # Every acknowledged batch survived the kill, whole (batches are atomic).
    assert set(acked) <= set(per_batch)
    assert all(count == ROWS for count in per_batch.values())

    # The engine replays everything from the start; the store takes only what it lacks.
    replay = start_writer(path)
    out, _ = replay.communicate(timeout=120)
    assert replay.returncode == 0
    dups = [int(line.split()[1]) for line in out.splitlines() if line.startswith("DUP")]
    assert set(per_batch) == set(dups)
    with TraceStore(path) as store:
        assert store.count("ingested_batches") == BATCHES
        assert store.count("block_events") == BATCHES * ROWS
        assert store.scalar("SELECT count(DISTINCT block_hash) FROM block_events") == BATCHES * ROWS
        assert store.count("requests") == BATCHES
