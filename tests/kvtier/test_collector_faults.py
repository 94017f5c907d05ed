"""Nothing that reached the collector is lost: the real ``kvtier collect`` in a child process,
fed by the real engine-side shipper.

* A stop signal (SIGTERM, SIGINT, SIGHUP) right after an engine shipped 300 batches: the
  collector stores what already reached its socket, each batch once, exits 0 and its last
  line gives the store's true counts.
* A store whose writes fail (the child's file size limit, which binds root too): ``/healthz``
  turns 503 with the reason while batches wait in memory; when writes work again they are
  stored and ``/healthz`` is 200 again; a store still failing at stop costs counted drops.
  Never a traceback.

(A ``--store`` that is not a DuckDB file is in the bad-input table, ``bad_input_cases.py``.)
"""

from __future__ import annotations

import json
import re
import resource
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import duckdb
import pytest

from kvtier.collector.shipper import Shipper, ShipperConfig
from tests.collector.test_shipper import record_requests, recorder
from tests.conftest import ANY_PORT, bound_to
from tests.kvtier.test_signals import start, wait_for_line  # noqa: F401 (start is a fixture)

pytestmark = pytest.mark.timeout(240)

BATCHES = 300
REQUESTS_PER_BATCH = 5  # record_requests: 2 block events and 1 request record per request


def ship(endpoint: str, batches: int, first: int = 0) -> None:
    """Ship exactly ``batches`` batches to ``endpoint`` and close the shipper, as an engine
    process that ends does; fails unless every one went out."""
    rec = recorder()
    shipper = Shipper(ShipperConfig(endpoint, interval_s=3600.0, queue_batches=BATCHES))
    shipper.add(rec)  # its thread wakes hourly: each ship_pending below is one batch
    try:
        for i in range(first, first + batches):
            record_requests(rec, REQUESTS_PER_BATCH, start=i * REQUESTS_PER_BATCH)
            assert shipper.ship_pending(deadline=time.monotonic() + 30) == 1
    finally:
        shipper.close()
    assert (shipper.batches_sent, shipper.batches_dropped) == (batches, 0)


def stored(store: Path) -> tuple[int, int, int, int]:
    """(batches, distinct (source, sequence), block events, requests) in the store."""
    with duckdb.connect(str(store), read_only=True) as con:
        return con.execute(
            "SELECT (SELECT count(*) FROM ingested_batches), "
            "(SELECT count(DISTINCT (source, sequence)) FROM ingested_batches), "
            "(SELECT count(*) FROM block_events), (SELECT count(*) FROM requests)").fetchone()


def last_line(output: str) -> str:
    return [line for line in output.splitlines() if line.strip()][-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=lambda s: signal.Signals(s).name)
def test_a_stop_right_after_the_engine_shipped_stores_every_batch_once(start, tmp_path, sig):
    store = tmp_path / "c.duckdb"
    process = start("collect", "--store", str(store), "--metrics-port", "0",
                    "--hooks", ANY_PORT, "--segments", str(tmp_path / "segments"),
                    "--stop-grace-s", "120")
    ship(bound_to(wait_for_line(process, "tap HooksTap started")[-1]), BATCHES)
    process.send_signal(sig)  # most batches still wait in the collector's socket now
    code = process.wait(timeout=180)
    out, err = process.stdout.read(), process.stderr.read()
    assert code == 0 and "Traceback" not in err, err
    events, requests = BATCHES * REQUESTS_PER_BATCH * 2, BATCHES * REQUESTS_PER_BATCH
    assert stored(store) == (BATCHES, BATCHES, events, requests)
    assert last_line(out) == (f"kvtier collect: stopped; the store holds {BATCHES} batches, "
                              f"{events:,} block events and {requests:,} requests; nothing "
                              "that arrived was lost"), out
    assert list((tmp_path / "segments").rglob("*.parquet"))  # the last export ran


def test_a_port_chosen_for_port_zero_is_named_at_start_and_on_healthz(start, tmp_path):
    process = start("collect", "--store", str(tmp_path / "c.duckdb"), "--metrics-port", "0",
                    "--hooks", "tcp://127.0.0.1:0", "--duration-s", "60")
    lines = wait_for_line(process, "tap HooksTap started")
    bound = re.search(r"bound to (tcp://127\.0\.0\.1:(\d+))$", lines[-1].strip())
    assert bound and int(bound.group(2)) > 0, lines[-1]
    status, body = healthz(health_url(lines))
    assert status == 200 and body["taps"][0]["endpoints"] == [bound.group(1)]
    ship(bound.group(1), 3)  # and the engines reach it there
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert stored(tmp_path / "c.duckdb")[0] == 3


# ---------------------------------------------------------------------- failing writes

def health_url(lines: list[str]) -> str:
    return next(line.split()[-1] for line in lines if "health at" in line)


def healthz(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_for_status(url: str, status: int, timeout_s: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code, body = healthz(url)
        if code == status:
            return body
        time.sleep(0.2)
    raise AssertionError(f"{url} not {status} within {timeout_s} s; last: {code} {body}")


def small_file_limit():
    """In the child: files stop growing at 100 kB (writes past it fail with EFBIG; the signal
    that would kill the process is ignored), for root too."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))


@pytest.fixture
def limited(start, tmp_path, monkeypatch):
    """A collector whose files cannot grow past 100 kB; (process, hooks endpoint, health URL)."""
    import subprocess

    real = subprocess.Popen

    def with_limit(*args, **kwargs):
        return real(*args, preexec_fn=small_file_limit, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", with_limit)
    process = start("collect", "--store", str(tmp_path / "c.duckdb"), "--metrics-port", "0",
                    "--hooks", ANY_PORT, "--stop-grace-s", "60")
    monkeypatch.setattr(subprocess, "Popen", real)
    lines = wait_for_line(process, "tap HooksTap started")
    return process, bound_to(lines[-1]), health_url(lines)


def test_failing_writes_turn_healthz_503_wait_in_memory_and_are_stored_when_writes_work(
        limited, tmp_path):
    process, endpoint, url = limited
    ship(endpoint, 200)  # ~200 kB of WAL: past the limit
    failing = wait_for_status(url, 503)
    assert failing["status"] == "failing" and failing["store"]["state"] == "failing"
    assert "File too large" in failing["store"]["last_error"]
    assert failing["store"]["backlog_batches"] > 0
    resource.prlimit(process.pid, resource.RLIMIT_FSIZE,
                     (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # room again
    recovered = wait_for_status(url, 200)
    assert recovered["store"]["dropped_batches_total"] == 0
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=120)
    out, err = process.stdout.read(), process.stderr.read()
    assert code == 0 and "Traceback" not in err, err
    assert stored(tmp_path / "c.duckdb")[:2] == (200, 200)
    assert last_line(out).endswith("; nothing that arrived was lost"), out
    assert len([line for line in err.splitlines() if "a write failed" in line]) == 1, err
    assert "writes work again" in err


def test_a_store_still_failing_at_stop_counts_what_it_dropped(limited, tmp_path):
    process, endpoint, url = limited
    ship(endpoint, 200)
    wait_for_status(url, 503)
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=120)
    out, err = process.stdout.read(), process.stderr.read()
    assert code == 0 and "Traceback" not in err, err
    batches = int(re.search(r"holds (\d+) batches", last_line(out)).group(1))
    dropped = int(re.search(r"; ([\d,]+) batch\(es\) were dropped because the store refused "
                            r"writes", last_line(out)).group(1).replace(",", ""))
    assert batches + dropped == 200 and dropped > 0, out
