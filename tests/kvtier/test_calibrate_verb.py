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
    # the file holds the engine model fitted on the store's steps: simulate prices with it
    sources = json.loads(capsys.readouterr().out)["parameter_sources"]
    assert sources == {"engine_model": "calibrated"}
    body = json.loads(params.read_text())
    body.pop("engine_model")  # without it, the queue model's calibrated costs
    params.write_text(json.dumps(body))
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
    assert main(["calibrate", str(store), "--gpu-blocks", "1000", "--gpu-sightings", "1"]) == 2
    assert "gpu_sightings must be 0 (cache every block) or >= 2" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["simulate", "--trace", str(store), "--gpu-tokens", "1e6", "--cost-params", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--cost-params" in err and "Traceback" not in err


def calibrated(capsys, *argv) -> dict:
    assert main(["calibrate", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_instance_is_calibrated_on_its_own_records_alone(tmp_path, capsys):
    from tests.collector.calibration_store import A, B, write

    write(tmp_path / "two.duckdb", A, B)  # node-b's steps cost 3.5x node-a's
    write(tmp_path / "a.duckdb", A)
    mine = calibrated(capsys, tmp_path / "two.duckdb", "--instance", "node-a")
    alone = calibrated(capsys, tmp_path / "a.duckdb")
    for name in ("requests", "step_records", "promotion_jobs", "kv_bytes_per_token", "fitted"):
        assert mine[name] == alone[name], name
    assert mine["engine_model"]["params"] == alone["engine_model"]["params"]
    both = calibrated(capsys, tmp_path / "two.duckdb")  # a second instance's steps move the fit
    assert both["engine_model"]["params"]["step_cost"] != mine["engine_model"]["params"]["step_cost"]


def test_a_tier_configuration_is_calibrated_on_that_phases_steps_and_jobs(tmp_path, capsys):
    from tests.collector.calibration_store import A, B, records, write

    write(tmp_path / "two.duckdb", A, B)
    promoting = calibrated(capsys, tmp_path / "two.duckdb", "--tier-config", "gpu+cpu")
    gpu_only = calibrated(capsys, tmp_path / "two.duckdb", "--tier-config", "gpu-only")
    a_steps, b_steps = len(records(A)[1]), len(records(B)[1])
    assert (promoting["requests"], promoting["promotion_jobs"]) == (A.phases[1].requests,
                                                                   A.phases[1].requests)
    assert gpu_only["promotion_jobs"] == 0
    assert promoting["step_records"] + gpu_only["step_records"] == a_steps + b_steps


def test_a_store_held_by_a_running_writer_is_calibrated_from_its_segments(tmp_path, capsys):
    from kvtier.collector.segments import export_segments
    from tests.collector.calibration_store import A, B, hold, write

    store = tmp_path / "kvtier.duckdb"
    write(store, A, B)
    with TraceStore(store) as writer:  # the segments a collector exports beside its store
        export_segments(writer, tmp_path / "segments")
    unlocked = calibrated(capsys, store, "--instance", "node-a")
    holder = hold(store)
    try:
        assert main(["calibrate", str(store), "--instance", "node-a", "--json"]) == 0
    finally:
        holder.kill()
        holder.wait()
    out, err = capsys.readouterr()
    assert err.startswith(f"kvtier calibrate: note: {store} is held by process {holder.pid}")
    locked = json.loads(out)
    for name in ("requests", "step_records", "promotion_jobs", "fitted", "engine_model"):
        assert locked[name] == unlocked[name], name
