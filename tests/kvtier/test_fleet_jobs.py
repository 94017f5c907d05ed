"""`simulate`, `evaluate` and `recommend` over the segments of two instances: each instance
analysed with its own tiers, in worker processes with --jobs, merged; the output does not
depend on --jobs, and the merge is the instances' own results added up."""

from __future__ import annotations

import json

import pytest

from kvtier.cli import main
from tests.kvtier.fleet_segments import fleet_segments

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def segments(tmp_path_factory):
    return fleet_segments(tmp_path_factory.mktemp("fleet"), max_requests=3000)


def run_json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


SIM = ["--gpu-tokens", "200k", "--cpu-tokens", "1M", "--json"]


def test_simulate_is_the_same_with_one_or_two_jobs_and_adds_up(segments, capsys):
    one = run_json(capsys, ["simulate", "--trace", str(segments), *SIM, "--jobs", "1"])
    two = run_json(capsys, ["simulate", "--trace", str(segments), *SIM, "--jobs", "2"])
    assert one == two
    parts = {p["instance"]: p for p in one["instances"]}
    assert sorted(parts) == ["node-a", "node-b"]
    for key in ("requests", "prompt_tokens", "gpu_hit_tokens", "cpu_promotion_tokens",
                "recompute_tokens", "cpu_stores_total"):
        assert one[key] == parts["node-a"][key] + parts["node-b"][key]
    assert one["requests"] == 3000
    alone = run_json(capsys, ["simulate", "--trace", str(segments), *SIM, "--instance", "node-b"])
    assert "instances" not in alone
    assert {k: alone[k] for k in parts["node-b"] if k != "instance"} == \
        {k: v for k, v in parts["node-b"].items() if k != "instance"}
    low, high = sorted([parts["node-a"]["ttft_p99_s"], parts["node-b"]["ttft_p99_s"]])
    assert one["ttft_p50_s"] <= one["ttft_p99_s"] and low <= one["ttft_p99_s"] <= high


def test_simulate_runs_little_work_in_process_and_more_in_workers(segments, capsys,
                                                                   monkeypatch):
    args = ["simulate", "--trace", str(segments), *SIM, "--jobs", "2"]
    assert main(args) == 0  # a few hundred KiB of segments: starting workers would cost more
    small = capsys.readouterr()
    assert "analysed in this process" in small.err and "below 1 MiB" in small.err
    monkeypatch.setattr("kvtier.verbs.simulate.PARALLEL_BYTES", 1)  # as if it were big
    assert main(args) == 0
    big = capsys.readouterr()
    assert "analysed in this process" not in big.err and "done (2/2" in big.err
    assert json.loads(big.out) == json.loads(small.out)


def test_a_capacity_sweep_merges_weighted_by_prompt_tokens(segments, capsys):
    args = ["simulate", "--trace", str(segments), "--sweep", "1e5,1e6,inf", "--json"]
    one = run_json(capsys, [*args, "--jobs", "1"])
    assert one == run_json(capsys, [*args, "--jobs", "2"])
    a, b = one["instances"]
    for i, point in enumerate(one["curve"]):
        expected = ((a["curve"][i]["token_hit_ratio"] * a["prompt_tokens"]
                     + b["curve"][i]["token_hit_ratio"] * b["prompt_tokens"])
                    / (a["prompt_tokens"] + b["prompt_tokens"]))
        assert point["token_hit_ratio"] == pytest.approx(expected, rel=1e-12)
    assert one["curve"][0]["token_hit_ratio"] < one["curve"][-1]["token_hit_ratio"]


def test_evaluate_is_the_same_with_one_or_two_jobs_and_adds_up(segments, capsys):
    args = ["evaluate", "--trace", str(segments), "--gpu-tokens", "200k", "--cpu-tokens", "500k",
            "--policies", "lru,arc,belady", "--split", "requests", "--json"]
    one = run_json(capsys, [*args, "--jobs", "1"])
    assert one == run_json(capsys, [*args, "--jobs", "2"])
    rows = {r["policy"]: r for r in one["policies"]}
    parts = [{r["policy"]: r for r in p["policies"]} for p in one["instances"]]
    for name, row in rows.items():
        assert row["prompt_tokens"] == sum(p[name]["prompt_tokens"] for p in parts)
        assert row["gpu_hit_tokens"] == sum(p[name]["gpu_hit_tokens"] for p in parts)
        assert "ttft_samples_s" not in row
    assert rows["lru"]["gap_closed"] == 0 and rows["belady"]["gap_closed"] == 1
    assert rows["lru"]["token_hit_ratio"] <= rows["belady"]["token_hit_ratio"]
    assert one["evaluated_requests"] == sum(p["evaluated_requests"] for p in one["instances"])
    capsys.readouterr()
    assert main([*args[:-1], "--jobs", "2"]) == 0  # the text form names both instances
    out = capsys.readouterr().out
    assert "instance node-a:" in out and "instance node-b:" in out


def test_recommend_writes_one_recommendation_per_instance_whatever_the_jobs(segments, tmp_path,
                                                                            capsys):
    outs = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        assert main(["recommend", "--trace", str(segments), "--gpu-tokens", "200k",
                     "--cpu-tokens", "1M", "--engine", "vllm", "--out", str(out),
                     "--host-headroom-bytes", str(64 << 30),  # not this host's memory now
                     "--jobs", str(jobs)]) == 0
        outs[jobs] = json.loads((out / "fleet.json").read_text())
        for part in outs[jobs]["instances"]:
            assert (out / f"instance={part['instance']}" / "recommendation.json").exists()
    strip = lambda index: [{k: v for k, v in p.items() if k != "out"} for p in index["instances"]]
    assert strip(outs[1]) == strip(outs[2])
    assert [p["instance"] for p in outs[1]["instances"]] == ["node-a", "node-b"]


def test_bad_jobs_is_one_line_and_a_store_file_splits_too(segments, tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:  # argparse's own exit
        main(["simulate", "--trace", str(segments), *SIM, "--jobs", "0"])
    assert refused.value.code == 2
    assert "argument --jobs: must be an int >= 1, got 0" in capsys.readouterr().err
    store = tmp_path / "both.duckdb"
    from kvtier.collector.batch import EventBatch
    from kvtier.collector.events import Origin, RequestRecord
    from kvtier.collector.store import TraceStore

    with TraceStore(store) as db:
        for name in ("x", "y"):
            db.ingest(EventBatch.from_rows(Origin("trace", name, name), 0, requests=[
                RequestRecord(f"{name}{i}", float(i), 32, block_hashes=(1, 2), block_size_tokens=16)
                for i in range(5)]))
    # a store file splits the same way; workers open it read-only side by side
    one = run_json(capsys, ["simulate", "--trace", str(store), *SIM])
    assert [p["instance"] for p in one["instances"]] == ["x", "y"] and one["requests"] == 10
    assert run_json(capsys, ["simulate", "--trace", str(store), *SIM, "--jobs", "2"]) == one
