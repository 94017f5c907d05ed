"""`kvtier simulate` and `kvtier analyze`: JSON keys, capacity forms, errors as one line."""

import json

import pytest

from kvtier.cli import main
from kvtier.policy.sim.policies import POLICIES
from kvtier.verbs.simulate import ENGINE_PRESETS


def write_mooncake(path, lines):
    path.write_text("".join(json.dumps(o) + "\n" for o in lines))
    return path


@pytest.fixture
def tiny_trace(tmp_path):
    lines = [{"timestamp": 1000 * i, "input_length": 1024, "output_length": 8,
              "hash_ids": [0, 1 + i % 3]} for i in range(12)]
    return write_mooncake(tmp_path / "tiny.jsonl", lines)


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_json_has_the_documented_keys(tiny_trace, capsys):
    out = run_json(capsys, ["simulate", "--trace", str(tiny_trace), "--gpu-tokens", "inf", "--json"])
    for key in ("requests", "prompt_tokens", "token_hit_ratio", "gpu_hit_tokens",
                "cpu_promotion_tokens", "cold_promotion_tokens", "recompute_tokens",
                "ttft_p99_s", "parameter_sources"):
        assert key in out
    # block 0 always hits after the first request; blocks 1..3 after their first use
    assert out["requests"] == 12 and out["gpu_hit_tokens"] == 11 * 512 + 9 * 512


def test_simulate_tiers_with_suffixes_and_bytes(tiny_trace, capsys):
    out = run_json(capsys, ["simulate", "--trace", str(tiny_trace), "--gpu-tokens", "1k",
                            "--cpu-tokens", "1GiB", "--model", "llama-3.1-8b", "--cold-tokens", "inf",
                            "--json"])
    assert out["gpu_blocks"] == 1 and out["cpu_blocks"] == 1 * 2**30 // 131072 // 512
    assert out["cold_blocks"] is None
    assert out["gpu_hit_tokens"] + out["cpu_promotion_tokens"] == 20 * 512


def test_a_byte_capacity_needs_the_model_named(tiny_trace, capsys):
    from kvtier.cli import main

    assert main(["simulate", "--trace", str(tiny_trace), "--gpu-tokens", "16GiB"]) == 2
    assert "--gpu-tokens 16GiB is in bytes: pass --model" in capsys.readouterr().err


def test_simulate_sweep_is_a_curve(tiny_trace, capsys):
    out = run_json(capsys, ["simulate", "--trace", str(tiny_trace), "--sweep", "512,2k,inf", "--json"])
    ratios = [p["token_hit_ratio"] for p in out["curve"]]
    assert out["method"] == "stack_distance" and ratios == sorted(ratios)
    assert ratios[-1] == pytest.approx(20 / 24)


@pytest.mark.parametrize("policy", [*POLICIES, *ENGINE_PRESETS])
def test_simulate_every_policy_runs(tiny_trace, capsys, policy):
    out = run_json(capsys, ["simulate", "--trace", str(tiny_trace), "--gpu-tokens", "1024",
                            "--cpu-tokens", "4096", "--policy", policy, "--json"])
    assert 0 < out["token_hit_ratio"] <= 20 / 24


@pytest.mark.parametrize("argv, message", [
    (["--gpu-tokens", "lots"], "--gpu-tokens: bad capacity 'lots'"),
    (["--gpu-tokens", "16GiB", "--model", "gpt-9"], "unknown model geometry 'gpt-9'"),
    ([], "--gpu-tokens is required"),
    (["--gpu-tokens", "1k", "--policy", "trtllm", "--cpu-tokens", "4k", "--cold-tokens", "5k"],
     "cold_blocks must be 0"),
    (["--gpu-tokens", "1k", "--cold-tokens", "5k"], "--cold-tokens 5k needs --cpu-tokens"),
    (["--sweep", "1k,2k", "--cpu-tokens", "4k"], "--cpu-tokens 4k would be ignored"),
])
def test_simulate_bad_options_are_one_line_errors(tiny_trace, capsys, argv, message):
    assert main(["simulate", "--trace", str(tiny_trace), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_trace_line_names_file_and_line_or_is_skipped(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]})
    path.write_text(good + "\n" + good.replace("10", "-10") + "\n")
    assert main(["simulate", "--trace", str(path), "--gpu-tokens", "inf"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: input_length must be a non-negative integer" in err
    out = run_json(capsys, ["simulate", "--trace", str(path), "--gpu-tokens", "inf", "--skip-bad", "--json"])
    assert out["requests"] == 1 and out["skipped_lines"] == 1


def test_missing_trace_is_a_one_line_error(tmp_path, capsys):
    assert main(["analyze", "--trace", str(tmp_path / "none.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_analyze_json_and_report_files(tiny_trace, tmp_path, capsys):
    out = run_json(capsys, ["analyze", "--trace", str(tiny_trace), "--gpu-tokens", "inf",
                            "--out", str(tmp_path / "report"), "--json"])
    assert set(out) == {"trace", "shared_prefixes", "reuse_timing", "block_sizing", "drop",
                        "offloading"}
    # an unlimited GPU captures all the reuse: offloading cannot add anything
    assert out["offloading"]["verdict"] == "do_not_offload"
    assert (tmp_path / "report" / "reuse_report.json").exists()
    assert "Offloading verdict" in (tmp_path / "report" / "reuse_report.txt").read_text()


def test_analyze_text(tiny_trace, capsys):
    assert main(["analyze", "--trace", str(tiny_trace)]) == 0
    assert "1. Which prefixes are shared" in capsys.readouterr().out


def test_trtllm_priority_gate_from_the_command_line(tiny_trace, capsys):
    base = ["simulate", "--trace", str(tiny_trace), "--gpu-tokens", "512", "--cpu-tokens", "8k",
            "--policy", "trtllm", "--json"]
    offloaded = run_json(capsys, [*base, "--default-priority", "30"])
    dropped = run_json(capsys, [*base, "--default-priority", "30", "--offload-comparison", "gt"])
    assert offloaded["cpu_promotion_tokens"] > 0 and dropped["cpu_promotion_tokens"] == 0
    assert main([*base, "--default-priority", "101"]) == 2
    assert "--default-priority must be in 0..100, got 101" in capsys.readouterr().err


def test_analyze_gpu_ratio_equals_a_gpu_only_lru_replay(tiny_trace, capsys):
    from kvtier.policy.readers import MooncakeReader
    from kvtier.policy.sim.config import SimConfig
    from kvtier.policy.sim.simulator import simulate
    out = run_json(capsys, ["analyze", "--trace", str(tiny_trace), "--gpu-tokens", "1024", "--json"])
    replay = simulate(MooncakeReader(tiny_trace).requests(), SimConfig(gpu_blocks=2))
    evidence = out["offloading"]["reasons"][1]["evidence"]
    assert f"{replay.token_hit_ratio:.1%}" in evidence
