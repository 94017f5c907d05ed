"""`kvtier calibrate STORE` and `kvtier simulate --cost-params`: the fitted file goes from one
verb to the other; bad inputs are one-line errors."""

from __future__ import annotations

import json
import random

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, Tier
from kvtier.collector.store import TraceStore
from kvtier.cli import main
from tests.policy.test_calibrate import engine_records, promotion_jobs


def write_store(path, rng) -> None:
    records = engine_records(rng=rng)
    events = []
    for job, record in zip(promotion_jobs(rng), records):
        for chunk in range(job.size_bytes // 65536):  # one event per 64 KiB chunk of the job
            events.append(BlockEvent(record.arrival_s, Outcome.CPU_PROMOTION, 7000 + chunk,
                                     request_id=record.request_id, size_bytes=65536,
                                     tier_from=Tier.CPU, tier_to=Tier.GPU, latency_s=job.latency_s))
    with TraceStore(path) as store:
        store.ingest(EventBatch.from_rows(Origin("vllm", "node-1", "hooks-1"), 0, events, records))


def test_calibrate_writes_the_parameters_simulate_prices_with(tmp_path, capsys):
    store, params = tmp_path / "kvtier.duckdb", tmp_path / "cost.json"
    write_store(store, random.Random(4))
    assert main(["calibrate", str(store), "--instance", "node-1", "--out", str(params), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 60 and report["kv_bytes_per_token"] == 2048
    assert report["fitted"]["prefill_tokens_per_s"] == json.loads(params.read_text())["cost_params"]["prefill_tokens_per_s"]
    assert main(["simulate", "--trace", str(store), "--policy", "vllm", "--gpu-tokens", "1e6",
                 "--cost-params", str(params), "--json"]) == 0
    sources = json.loads(capsys.readouterr().out)["parameter_sources"]
    assert sources["prefill_tokens_per_s"] == sources["request_overhead_s"] == "calibrated"
    assert sources["cold_cpu_bandwidth_bytes_per_s"] == "default"


def test_calibrate_checks_the_simulator_when_given_the_capacities(tmp_path, capsys):
    store = tmp_path / "kvtier.duckdb"
    write_store(store, random.Random(5))
    assert main(["calibrate", str(store), "--gpu-blocks", "1000", "--cpu-blocks", "0"]) == 0
    out = capsys.readouterr().out
    assert "tier split:" in out and "requests exact" in out and "ttft: p50" in out


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    assert main(["calibrate", str(tmp_path / "none.duckdb")]) == 2
    assert "no store at" in capsys.readouterr().err
    store = tmp_path / "kvtier.duckdb"
    write_store(store, random.Random(6))
    assert main(["calibrate", str(store), "--instance", "elsewhere"]) == 2
    assert "no engine request records" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["simulate", "--trace", str(store), "--gpu-tokens", "1e6", "--cost-params", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--cost-params" in err and "Traceback" not in err
