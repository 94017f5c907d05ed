"""`kvtier collect` end to end: vLLM-format KV events over ZMQ in, /metrics and segments out."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import msgpack
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from kvtier.collector.service import CollectorConfig
from tests.conftest import ANY_PORT, bound_to, free_port

pytestmark = pytest.mark.timeout(90)


def frame(seq: int, hashes: list[int], medium: str) -> list[bytes]:
    events = [{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": list(range(16 * len(hashes))),
               "block_size": 16, "lora_id": None, "medium": medium, "lora_name": None}]
    return [b"kv", seq.to_bytes(8, "big"), msgpack.packb([time.time(), events, 0])]


def scrape(url: str) -> dict:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_collect_ingests_vllm_events_and_serves_metrics_and_segments(tmp_path):
    store, segments = tmp_path / "kvtier.duckdb", tmp_path / "segments"
    service = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "collect", "--store", str(store), "--segments", str(segments),
         "--export-every-s", "1", "--metrics-port", "0", "--vllm-events", ANY_PORT, "--instance", "node-9"],
        stdout=subprocess.PIPE, text=True)
    publisher = zmq.Context.instance().socket(zmq.PUB)
    try:
        url = endpoint = None
        for line in service.stdout:
            if "metrics at" in line:
                url = line.split("metrics at ", 1)[1].strip()
            if "tap VllmEventTap started" in line:
                endpoint = bound_to(line)  # the port the tap got for :0
                break
        assert url and url.startswith("http://127.0.0.1:") and endpoint.startswith("tcp://127.0.0.1:")
        publisher.connect(endpoint)  # vLLM's publisher connects when the endpoint is not a wildcard
        key = (("engine", "vllm"), ("engine_instance", "node-9"), ("kind", "store"),
               ("source", "kv_events"), ("tier", "gpu"))
        deadline, seq, seen = time.monotonic() + 30, 0, {}
        while time.monotonic() < deadline:
            publisher.send_multipart(frame(seq, [1000 + seq, 2000 + seq], "GPU"))
            seq += 1
            time.sleep(0.2)
            seen = scrape(url)
            if seen.get(("kvtier_block_events_total", key), 0) >= 6:
                break
        assert seen.get(("kvtier_block_events_total", key), 0) >= 6
        tap_labels = (("endpoint", ANY_PORT), ("engine_instance", "node-9"), ("tap", "VllmEventTap"))  # as given
        assert seen[("kvtier_tap_errors_total", tap_labels)] == 0
        assert seen[("kvtier_tap_up", tap_labels)] == 1
        time.sleep(1.5)  # one export period
    finally:
        publisher.close(linger=0)
        service.send_signal(signal.SIGTERM)
        out, _ = service.communicate(timeout=30)
    assert service.returncode == 0
    assert "stopped; the store holds" in out
    import duckdb

    con = duckdb.connect()
    stored = con.sql(f"SELECT count(*), count(DISTINCT block_hash) FROM read_parquet('{segments}/block_events/**/*.parquet', "
                     "hive_partitioning = true) WHERE instance = 'node-9' AND kind = 'store'").fetchall()[0]
    assert stored[0] >= 6 and stored[0] == stored[1]


def test_config_rejects_bad_values(tmp_path):
    with pytest.raises(ValueError, match="export_every_s"):
        CollectorConfig(store_path=tmp_path / "s.duckdb", export_every_s=0)
    with pytest.raises(ValueError, match="metrics_port"):
        CollectorConfig(store_path=tmp_path / "s.duckdb", metrics_port=70000)


def test_emit_monitoring_writes_both_files(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kvtier", "collect", "--emit-monitoring", str(tmp_path),
                             "--ttft-p99-budget-s", "1.5"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"value": 1.5' in (tmp_path / "grafana-dashboard.json").read_text()
    assert "> 1.5" in (tmp_path / "kvtier-alerts.yml").read_text()


def test_collect_hooks_stores_shipped_batches_and_exports_the_engines_drops(tmp_path):
    """`kvtier collect --hooks`: an engine-side shipper that started before the collector
    dropped a batch (counted); once the collector is up its batches are stored and the count
    reaches /metrics as kvtier_recorder_dropped_events_total."""
    from kvtier.collector.events import Origin, Outcome, RequestRecord
    from kvtier.collector.recorder import Recorder
    from kvtier.collector.shipper import Shipper, ShipperConfig

    endpoint = f"tcp://127.0.0.1:{free_port()}"  # known before the collector binds it
    store = tmp_path / "kvtier.duckdb"
    recorder = Recorder(Origin("vllm", "node-3", "vllm-hooks:node-3:e1:1"))
    shipper = Shipper(ShipperConfig(endpoint, interval_s=0.05))
    shipper.add(recorder)
    for i in range(3):  # no collector yet: dropped and counted
        recorder.record(int(Outcome.GPU_HIT), i, request_id="early")
    while shipper.batches_dropped == 0:
        time.sleep(0.02)
    service = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "collect", "--store", str(store), "--metrics-port", "0",
         "--hooks", endpoint], stdout=subprocess.PIPE, text=True)
    try:
        url = None
        for line in service.stdout:
            if "metrics at" in line:
                url = line.split("metrics at ", 1)[1].strip()
            if "tap HooksTap started" in line:
                assert endpoint in line
                break
        key = ("kvtier_recorder_dropped_events_total", (("engine", "vllm"), ("engine_instance", "node-3")))
        deadline, seen = time.monotonic() + 30, {}
        while time.monotonic() < deadline and seen.get(key) != 3:
            recorder.record_request(RequestRecord("late", time.time(), 10))
            time.sleep(0.2)
            seen = scrape(url)
        assert seen.get(key) == 3
    finally:
        shipper.close(1.0)
        service.send_signal(signal.SIGTERM)
        out, _ = service.communicate(timeout=30)
    assert service.returncode == 0
    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT count(*) FROM requests WHERE request_id = 'late'").fetchone()[0] >= 1
    assert con.execute("SELECT count(*) FROM block_events WHERE request_id = 'early'").fetchone()[0] == 0
    con.close()
