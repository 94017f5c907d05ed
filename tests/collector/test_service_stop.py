"""The collector service at its edges: a segment export that fails is one line and a 503 until
it works again; a hooks tap stopped without grace counts what waited in its socket; a stop
reports the store's counts after its last write."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from kvtier.collector.hooks_tap import HooksTap, HooksTapConfig
from kvtier.collector.service import CollectorConfig, CollectorService, StopSummary
from kvtier.collector.shipper import Shipper, ShipperConfig
from tests.collector.test_shipper import record_requests, recorder

pytestmark = pytest.mark.timeout(60)


def healthz(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_failing_segment_export_is_one_line_and_a_503_until_it_works_again(tmp_path, caplog):
    blocker = tmp_path / "segments-parent"
    blocker.write_text("a file where the segment folder's parent should be")
    config = CollectorConfig(store_path=tmp_path / "s.duckdb", segments_dir=blocker / "segments",
                             metrics_port=0, instance="n1", export_every_s=3600)
    service = CollectorService(config).start()
    rec = recorder()
    record_requests(rec, 2)
    service.ingest(rec.take_packed().to_event_batch(0))
    try:
        assert service.export_segments() == 0 and service.export_segments() == 0
        status, body = healthz(service.metrics.health_url)
        assert status == 503 and body["segments"]["state"] == "failing"
        assert body["segments"]["last_error"]
        blocker.unlink()  # room for the folder again
        service.export_segments()
        status, body = healthz(service.metrics.health_url)
        assert status == 200 and body["segments"] == {"state": "ok", "last_error": None}
    finally:
        summary = service.stop()
    said = [r.getMessage() for r in caplog.records]
    assert sum("segment export to" in m and "failed" in m for m in said) == 1
    assert sum("works again" in m for m in said) == 1
    assert not [r for r in caplog.records if r.exc_info]  # no traceback
    assert summary == StopSummary(1, 4, 2, unread_batches=0, dropped_batches=0)


def test_a_hooks_tap_stopped_without_grace_counts_every_batch_left_in_its_socket():
    tap = HooksTap(HooksTapConfig(("tcp://127.0.0.1:0",)), lambda batch: None)
    (endpoint,) = tap.open()
    rec = recorder()
    shipper = Shipper(ShipperConfig(endpoint, interval_s=3600.0))
    shipper.add(rec)
    try:
        for i in range(20):
            record_requests(rec, 1, start=i)
            assert shipper.ship_pending(deadline=time.monotonic() + 10) == 1
    finally:
        shipper.close()
    unread = 0
    for _ in range(200):  # what is still on its way in is counted by a later call
        unread += tap.drain(0.0)
        if unread == 20:
            break
        time.sleep(0.05)
    tap.close()
    assert unread == 20 and tap.stats.batches == 0  # counted, none delivered


def test_a_stop_reports_what_the_store_holds_after_the_taps_last_batches(tmp_path):
    config = CollectorConfig(store_path=tmp_path / "s.duckdb", metrics_port=None, instance="n1",
                             stop_grace_s=30)
    made = []

    def hooks(on_batch):
        made.append(HooksTap(HooksTapConfig(("tcp://127.0.0.1:0",)), on_batch))
        return made[-1]

    service = CollectorService(config, [hooks]).start()
    rec = recorder()
    shipper = Shipper(ShipperConfig(made[0].bound[0], interval_s=3600.0))
    shipper.add(rec)
    try:
        for i in range(30):
            record_requests(rec, 2, start=2 * i)
            assert shipper.ship_pending(deadline=time.monotonic() + 10) == 1
    finally:
        shipper.close()
        summary = service.stop()  # at once: most batches still wait in the socket
    assert summary == StopSummary(30, 120, 60, unread_batches=0, dropped_batches=0)
