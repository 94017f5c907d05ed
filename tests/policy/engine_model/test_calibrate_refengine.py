"""`kvtier calibrate` on a store the reference engine wrote under concurrent load: the engine
model fits on the earlier half and predicts the later half's latencies."""

from __future__ import annotations

import json

import pytest

from kvtier.cli import main
from kvtier.policy.engine_model.params import FITTED_FROM, read_engine_params
from tests.policy.engine_model.refengine_store import write_store

pytestmark = pytest.mark.timeout(300)

# Measured on this project's shared 2-core host while other suites ran (8 runs of this test's
# store, concurrency 4, 120 requests, and 6 stores of benchmarks/prediction.py's at concurrency
# 1 and 4): held-out TTFT p50 predicted/measured 0.89-1.86. The same decode batch takes
# 1.1-7 ms from one step to the next there, and that noise differs between the halves the
# model is fitted and checked on, so the band leaves about 2x either side.
P50_BAND = (0.4, 4.0)


def test_calibrate_fits_concurrent_reference_engine_traffic_and_predicts_the_later_half(tmp_path, capsys):
    store, params = tmp_path / "store.duckdb", tmp_path / "cost.json"
    write_store(store, concurrency=4, requests=120, seed=1)
    assert main(["calibrate", str(store), "--json", "--out", str(params)]) == 0
    report = json.loads(capsys.readouterr().out)
    held = report["engine_model"]
    assert held["params"]["fitted_from"] in FITTED_FROM
    assert held["fit_requests"] == 60
    (check,) = held["by_tier_config"]
    assert check["tier_config_id"] == "gpu+cpu" and check["requests"] == 60
    assert check["closed_loop"]  # four clients, each waiting for its last answer
    assert P50_BAND[0] <= check["ratio"]["ttft_p50_s"] <= P50_BAND[1], check
    assert check["predicted"]["itl_p50_s"] > 0
    written = read_engine_params(params)
    assert written is not None and written.limits.max_running >= 4
    # the file carries the check too: recommend --cost-params puts it beside its prediction
    (carried,) = json.loads(params.read_text())["held_out"]["by_tier_config"]
    assert (carried["requests"], carried["predicted"]) == (60, check["predicted"])


def test_the_text_report_puts_both_models_side_by_side(tmp_path, capsys):
    store = tmp_path / "store.duckdb"
    write_store(store, concurrency=2, requests=40, seed=2)
    assert main(["calibrate", str(store)]) == 0
    out = capsys.readouterr().out
    assert "engine model fitted on the earliest 20 requests" in out
    assert "ttft p50" in out and "itl p99" in out and "gpu+cpu (20" in out


def test_too_few_requests_for_the_engine_model_leave_the_single_server_fit_standing(tmp_path, capsys):
    import random

    from kvtier.collector.batch import EventBatch
    from kvtier.collector.events import Origin
    from kvtier.collector.store import TraceStore
    from tests.policy.test_calibrate import engine_records

    store = tmp_path / "kvtier.duckdb"
    with TraceStore(store) as s:  # ten requests, one at a time: five to fit, five to check
        s.ingest(EventBatch.from_rows(Origin("vllm", "node-1", "hooks-1"), 0, [],
                                      engine_records(10, rng=random.Random(3))))
    assert main(["calibrate", str(store), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "prefill_tokens_per_s" in report["fitted"]
    assert "the fit needs >= 8" in report["engine_model"]["note"]
