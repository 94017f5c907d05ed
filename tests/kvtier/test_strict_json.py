"""Every JSON kvtier writes is strict JSON: on a store whose requests carry no inter-token
latency (an engine that streamed none), the engine model's held-out ITL is unknown; kvtier
calibrate's --out and --json, and the recommendation folder recommend writes from them
(recommendation.calibration.json among its files), hold null there, not NaN, which a strict
parser (a browser's JSON.parse, jq) refuses."""

from __future__ import annotations

import dataclasses
import json

from kvtier.cli import main
from kvtier.collector import columns
from kvtier.collector.batch import EventBatch
from kvtier.collector.events import Origin, StepRecord
from kvtier.collector.store import TraceStore
from tests.collector import calibration_store
from tests.collector.test_json_text import strict


def write_store_without_itl(path) -> None:
    requests, steps, events = calibration_store.records(calibration_store.A)
    requests = [dataclasses.replace(r, itl_s=None) for r in requests]
    step_table, _ = columns.rows_to_table(StepRecord, steps)
    batch = EventBatch.from_rows(Origin("reference", "node-a", "node-a/engine"), 0, events, requests)
    with TraceStore(path) as store:
        store.ingest(EventBatch(batch.origin, 0, batch.block_events, batch.requests, batch.rejected,
                                step_records=step_table))


def test_calibrate_and_recommend_write_unknown_latencies_as_null(tmp_path, capsys):
    store, params, reco = tmp_path / "kvtier.duckdb", tmp_path / "cost.json", tmp_path / "reco"
    write_store_without_itl(store)
    assert main(["calibrate", str(store), "--out", str(params), "--json"]) == 0
    printed = strict(capsys.readouterr().out)
    (check,) = strict(params.read_text())["held_out"]["by_tier_config"]
    assert check["measured"]["itl_p50_s"] is None and check["ratio"]["itl_p99_s"] is None
    assert check["measured"]["ttft_p50_s"] > 0
    assert printed["engine_model"]["by_tier_config"][0]["measured"]["itl_p50_s"] is None
    assert main(["recommend", "--store", str(store), "--cost-params", str(params),
                 "--gpu-tokens", "2k", "--out", str(reco)]) == 0
    written = sorted(reco.glob("*.json"))
    assert "recommendation.calibration.json" in [p.name for p in written]
    for path in written:
        strict(path.read_text())
    (shown,) = json.loads((reco / "recommendation.calibration.json").read_text())["by_tier_config"]
    assert shown["measured"]["itl_p50_s"] is None
