"""A damaged store, as a user meets it: the real ``kvtier collect`` writes a store fed by the
real engine-side shipper, and the file is then cut short (a copy that stopped half way, a
full disk during a copy).

* ``kvtier collect`` on it refuses to start, in one line, without touching the file; the
  verbs that only read a store say the same.
* Cut under a running collector: every batch that reached its hooks tap is stored or counted
  with the reason; the tap is never taken for a broken socket, and the last line says the
  store is damaged instead of quoting counts from a catalog no query can read.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvtier.collector.shipper import Shipper, ShipperConfig
from tests.collector.test_damaged_store import cut_point
from tests.collector.test_shipper import record_requests, recorder
from tests.kvtier.test_collector_faults import health_url, healthz, last_line
from tests.kvtier.test_signals import ENV, start, wait_for_line  # noqa: F401 (start is a fixture)

pytestmark = pytest.mark.timeout(240)


def ship(endpoint: str, batches: int, engine: str) -> None:
    """Ship ``batches`` batches from one engine's recorder, each one sent, then close."""
    rec = recorder(engine)
    shipper = Shipper(ShipperConfig(endpoint, interval_s=3600.0, queue_batches=batches))
    shipper.add(rec)  # its thread wakes hourly: each ship_pending below is one batch
    try:
        for i in range(batches):
            record_requests(rec, 2, start=2 * i)
            assert shipper.ship_pending(deadline=time.monotonic() + 30) == 1
    finally:
        shipper.close()
    assert (shipper.batches_sent, shipper.batches_dropped) == (batches, 0)


def collector(start, store: Path) -> tuple[subprocess.Popen, str, str]:
    """A running ``kvtier collect`` on ``store``: (process, hooks endpoint, health URL)."""
    process = start("collect", "--store", str(store), "--metrics-port", "0", "--hooks",
                    "tcp://127.0.0.1:0", "--stop-grace-s", "60")
    lines = wait_for_line(process, "tap HooksTap started")
    endpoint = re.search(r"bound to (\S+)$", lines[-1].strip()).group(1)
    return process, endpoint, health_url(lines)


def stop(process: subprocess.Popen) -> tuple[str, str]:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 0
    out, err = process.stdout.read(), process.stderr.read()
    assert "Traceback" not in err, err
    return out, err


@pytest.fixture
def written(start, tmp_path) -> Path:
    """A store ``kvtier collect`` wrote from 40 shipped batches, stopped cleanly."""
    store = tmp_path / "kvtier.duckdb"
    process, endpoint, _ = collector(start, store)
    ship(endpoint, 40, "engine-a")
    out, _ = stop(process)
    assert last_line(out).startswith("kvtier collect: stopped; the store holds 40 batches"), out
    return store


def kvtier(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvtier", *argv], capture_output=True,
                          text=True, env=ENV, timeout=120)


def test_a_store_cut_short_stops_collect_at_start_and_every_reader_in_one_line(written):
    size = written.stat().st_size
    cut = cut_point(written)
    os.truncate(written, cut)
    before = hashlib.sha256(written.read_bytes()).hexdigest()
    says = (f"{written} is damaged (cut short: it holds {cut:,} bytes of the {size:,} its "
            "header names); restore it from a copy, or give another path (Parquet segments it "
            "exported keep their rows)")
    started = kvtier("collect", "--store", str(written), "--metrics-port", "0", "--hooks",
                     "tcp://127.0.0.1:0", "--duration-s", "30")
    assert (started.returncode, started.stdout) == (2, "")  # never said it was storing
    assert started.stderr.splitlines() == [f"kvtier collect: error: {says}"]
    for verb, argv in (("store", ("store", "info", str(written))),
                       ("analyze", ("analyze", "--store", str(written))),
                       ("simulate", ("simulate", "--trace", str(written), "--gpu-tokens", "1000"))):
        result = kvtier(*argv)
        assert (result.returncode, result.stderr.splitlines()) == (2, [f"kvtier {verb}: error: {says}"])
    assert hashlib.sha256(written.read_bytes()).hexdigest() == before


def counted(health: dict) -> int:
    """Batches the hooks tap has counted. The tap hands what one poll read to the store in one
    commit and counts the batches after it (the first of a stream asks the ledger where the
    stream resumes), so the store's backlog can hold all of them a moment before the tap has
    counted them and read the ledger."""
    (tap,) = health["taps"]
    return sum(source["batches"] for source in tap["sources"])


def test_a_store_cut_under_a_running_collector_loses_no_batch_uncounted(start, written):
    cut = cut_point(written)
    process, endpoint, url = collector(start, written)
    os.truncate(written, cut)  # the ledger's rows are past the end now
    ship(endpoint, 20, "engine-b")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # every batch reached the collector: none in flight
        status, health = healthz(url)
        if health["store"]["backlog_batches"] == 20 and counted(health) == 20:
            break
        time.sleep(0.2)
    assert status == 503 and health["store"]["state"] == "failing", health
    assert "is damaged" in health["store"]["read_error"]
    (tap,) = health["taps"]
    assert (tap["state"], tap["failures_total"]) == ("running", 0)  # its socket was never closed
    out, err = stop(process)
    assert re.fullmatch(
        rf"kvtier collect: stopped; {re.escape(str(written))} is damaged \(cut short at byte "
        r"[\d,]+\); restore it from a copy, or give another path \(Parquet segments it "
        r"exported keep their rows\); 20 batch\(es\) were dropped because the store refused "
        r"writes", last_line(out)), out
    assert len([line for line in err.splitlines() if "ledger cannot be read" in line]) == 1, err
