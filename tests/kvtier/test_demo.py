"""`kvtier demo` end to end on the bundled traces, through the real reference engine: the CPU
phase changes what is served and TTFT by what the summary states, the summary's settings are
recommendation.json's, no size exceeds its measured cap, the report and the what-if curves
are written, and analyze and recommend give one verdict."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from kvtier.policy.recommend.recommendation import from_json
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    result = subprocess.run([sys.executable, "-m", "kvtier", "demo", "--out", str(out),
                             "--requests", "150", "--chat-requests", "60"],
                            capture_output=True, text=True, timeout=540, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.stdout[result.stdout.index("kvtier demo: summary"):]
    return out, result.stdout, summary


def test_both_acts_run_and_each_phase_is_explained(demo):
    out, stdout, _ = demo
    assert "act one, agentic coding sessions" in stdout and "act two, chat" in stdout
    for phase in ("agentic/gpu-only", "agentic/gpu+cpu", "chat/gpu-only", "chat/gpu+cpu"):
        assert re.search(rf"^    {re.escape(phase)}: ", stdout, re.M), phase  # what it shows
    assert stdout.count("the rule's budget: TTFT p99 <=") == 2  # each act's baseline sets one
    assert not (out / "file-tier").exists()  # the engine's file blocks do not outlive it


def test_the_summary_states_what_the_cpu_phase_measured(demo):
    out, _, summary = demo
    from kvtier.collector.store import TraceStore

    with TraceStore(out / "kvtier.duckdb") as store:
        rows = store.query("""
            SELECT tier_config_id, ttft_s, prompt_tokens, gpu_hit_tokens, cpu_promotion_tokens,
                   cold_promotion_tokens, recomputed_tokens
            FROM requests_with_origin WHERE engine = 'load-probe'""").to_pylist()

    def phase(config):
        mine = [r for r in rows if r["tier_config_id"] == config]
        served = sum(r["gpu_hit_tokens"] + r["cpu_promotion_tokens"] + r["cold_promotion_tokens"]
                     for r in mine)
        total = served + sum(r["recomputed_tokens"] for r in mine)
        return served / total, float(np.percentile([r["ttft_s"] for r in mine], 50)) * 1e3

    (base_served, base_p50), (cpu_served, cpu_p50) = phase("agentic/gpu-only"), phase("agentic/gpu+cpu")
    line = next(line for line in summary.splitlines() if "measured on the engine" in line)
    stated = re.search(r"served ([\d.]+)% -> ([\d.]+)% .* TTFT p50 ([\d.]+) ms -> ([\d.]+) ms", line)
    assert [float(v) for v in stated.groups()] == pytest.approx(
        [base_served * 100, cpu_served * 100, base_p50, cpu_p50], abs=0.051)
    assert cpu_served > base_served + 0.2  # the CPU tier visibly serves what the GPU could not
    assert cpu_p50 < base_p50
    assert re.search(r"expected on the later requests against the GPU tier alone \(the engine model, "
                     r"period percentiles.*TTFT p50 [-+][\d.]+ ms \[[-+][\d.]+, [-+][\d.]+\], "
                     r"measured [-+][\d.]+ ms \((inside|OUTSIDE)\)", summary)


PROMISE = re.compile(r"([\d.-]+) \[([\d.-]+), ([\d.-]+)\] / ([\d.-]+) (inside|OUTSIDE)")


def test_the_recommendations_own_promise_is_shown_beside_the_same_later_requests(demo):
    """The promise recommendation.json holds (GPU tier alone, the recommended CPU tier, the
    change) against what the engine measured on the same later share of each phase."""
    out, stdout, _ = demo
    from kvtier.collector.store import TraceStore

    rec = from_json(json.loads((out / "recommendation" / "recommendation.json").read_text()))
    ev = rec.evidence
    if ev.latency_model.model is None:  # its held-out check missed grossly on this host: said
        assert ev.latency_model.flag and f"no TTFT change is promised: {ev.latency_model.why}" in stdout
        return
    assert ev.latency_model.model == "engine" and ev.latency_model.arrivals == "closed"
    share = ev.train_requests / (ev.train_requests + ev.evaluated_requests)
    rows = {m.group(1): PROMISE.findall(m.group(2)) for m in re.finditer(
        r"^    (ttft_p\d\d) +(.*)\(levels predicted/measured", stdout, re.M)}
    assert set(rows) == {"ttft_p50", "ttft_p95", "ttft_p99"}
    with TraceStore(out / "kvtier.duckdb") as store:
        def later(config):
            ttft = [r["ttft_s"] for r in store.query(
                "SELECT ttft_s FROM requests_with_origin WHERE engine = 'reference' AND "
                "tier_config_id = ? ORDER BY arrival_s", [config]).to_pylist()]
            return np.array(ttft[int(len(ttft) * share):])

        base, cand = later("agentic/gpu-only"), later("agentic/gpu+cpu")
    by = {c.metric: c for c in ev.expected_vs_gpu_only}
    for name, cells in rows.items():
        q = int(name[-2:])
        change = by[f"{name}_s"]
        (bp, bl, bh, bm, _), (cp, cl, ch, cm, _), (dp, dl, dh, dm, dv) = cells
        assert float(bp) == pytest.approx(change.baseline * 1e3, abs=0.051)
        assert float(cp) == pytest.approx(change.candidate * 1e3, abs=0.051)
        assert float(dl) == pytest.approx(change.low * 1e3, abs=0.051)
        assert float(bm) == pytest.approx(np.percentile(base, q) * 1e3, abs=0.051)
        assert float(cm) == pytest.approx(np.percentile(cand, q) * 1e3, abs=0.051)
        assert float(bl) <= float(bp) <= float(bh) and float(cl) <= float(cp) <= float(ch)
        # the promise's levels hold this engine to its scale on a host the suite loads
        for predicted, measured in ((bp, bm), (cp, cm)):
            assert 0.5 <= float(predicted) / float(measured) <= 2.0, (name, cells)


CELL = re.compile(r"([\d.]+) ms \[([\d.]+), ([\d.]+)\] / ([\d.]+) ms \(([\d.]+), (inside|outside)\)")


def test_the_engine_model_calibrated_on_the_baseline_prices_the_recommendation(demo):
    out, stdout, _ = demo
    body = json.loads((out / "engine-model.json").read_text())
    assert body["engine_model"]["fitted_from"] == "step_records"
    assert body["engine_model"]["limits"]["first_token"] == "own_prefill"  # the reference engine
    assert f"--cost-params {out / 'engine-model.json'}" in stdout  # recommend was given it
    # the reference engine's KV bytes (2 layers x K,V x 2 heads x 16 x float32), not a default model's
    assert body["engine_model"]["kv_bytes_per_token"] == 512
    # the GPU-only phase promotes nothing: the canary priced a promotion, as the demo says
    per_block_us = body["engine_model"]["step_cost"]["loaded_byte_s"] * 512 * 16 * 1e6
    said = re.search(r"a block promoted from a CPU tier costs the engine's step (\d+) us \(a canary "
                     r"engine with a CPU tier, (\d+) promoting steps\)", stdout)
    assert said and int(said.group(2)) >= 3
    assert int(said.group(1)) == pytest.approx(per_block_us, abs=0.51) and per_block_us > 0


def test_each_deployed_configuration_shows_its_predicted_ttft_beside_the_engines_measurement(demo):
    out, stdout, _ = demo
    from kvtier.collector.store import TraceStore

    rows = {m.group(1): CELL.findall(m.group(3)) for m in re.finditer(
        r"^    (agentic/\S+) +(\d+)  (.* ms \(.*)$", stdout, re.M) if CELL.search(m.group(3))}
    assert set(rows) == {"agentic/gpu-only", "agentic/gpu+cpu"}  # the baseline and the tiers deployed
    with TraceStore(out / "kvtier.duckdb") as store:
        for config, cells in rows.items():
            ttft = [r["ttft_s"] for r in store.query(
                "SELECT ttft_s FROM requests_with_origin WHERE engine = 'reference' "
                "AND tier_config_id = ?", [config]).to_pylist()]
            measured_ms = np.percentile(ttft, [50, 95, 99]) * 1e3
            assert len(cells) == 3, config
            for (pred, low, high, meas, ratio, verdict), expected in zip(cells, measured_ms):
                pred, low, high, meas = float(pred), float(low), float(high), float(meas)
                assert meas == pytest.approx(expected, abs=0.051)  # the engine's own records
                assert low <= pred <= high
                # the ratio of the unrounded figures: within what printing to 0.1 ms allows
                lowest, highest = (pred - 0.05) / (meas + 0.05), (pred + 0.05) / (meas - 0.05)
                assert lowest - 0.005 <= float(ratio) <= highest + 0.005
                # the engine model holds the engine to its own scale on this host, loaded by
                # the rest of the suite: well inside 2x either way (before it modelled shared
                # prefixes, new clients and an in-process store: 0.44 at p95 with a CPU tier)
                assert 0.5 <= float(ratio) <= 2.0, (config, cells)
                if min(abs(meas - low), abs(meas - high)) > 0.05:  # not at a printed bound
                    assert verdict == ("inside" if low <= meas <= high else "outside")


def test_the_summary_sets_what_recommendation_json_says(demo):
    out, _, summary = demo
    doc = json.loads((out / "recommendation" / "recommendation.json").read_text())
    rec = from_json(doc)
    stated = dict(re.findall(r"^    (\w+) = (\S+)", summary, re.M))
    assert int(stated["cpu_tier_bytes"]) == doc["settings"]["cpu_tier_bytes"] == rec.knob("cpu_tier_bytes").value
    assert int(stated["offload_min_priority"]) == doc["settings"]["offload_min_priority"]
    assert f"verdict: {rec.verdict.words}" in summary
    rule = rec.evidence.rollback
    assert f"TTFT p99 > {rule.ttft_p99_s * 1e3:.1f} ms" in summary  # the rule to deploy with it


def test_no_size_exceeds_its_cap_and_the_report_shows_the_curve(demo):
    out, _, _ = demo
    rec = from_json(json.loads((out / "recommendation" / "recommendation.json").read_text()))
    assert {s.tier for s in rec.evidence.sizes} == {"cpu", "cold"}
    for size in rec.evidence.sizes:
        assert size.cap_bytes is not None and size.chosen_bytes <= size.cap_bytes  # both measured
        assert size.chosen_bytes <= size.knee_bytes  # never the free space itself
    report = (out / "recommendation" / "report.md").read_text()
    assert "## Tier sizes from the curve" in report and "next GiB frees" in report
    assert (out / "recommendation" / "cpu_tier_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_the_whatif_curves_mark_the_recommended_size(demo):
    out, _, _ = demo
    rec = from_json(json.loads((out / "recommendation" / "recommendation.json").read_text()))
    sweep = json.loads((out / "whatif" / "cpu_sweep.json").read_text())
    assert {p["policy"] for p in sweep["points"]} == {"lru", "arc", "s3fifo", "belady", "recommended"}
    chosen_tokens = rec.evidence.size("cpu").chosen_blocks * rec.evidence.block_tokens
    assert sweep["chosen"] == {"policy": "lru", "cpu_capacity_tokens": chosen_tokens}
    at = {(p["policy"], p["cpu_capacity_tokens"]): p["token_hit_ratio"] for p in sweep["points"]}
    for policy in ("lru", "recommended"):
        assert at[("belady", chosen_tokens)] >= at[(policy, chosen_tokens)] - 1e-9  # the bound
    # replayed as the recommendation measured: the same requests counted, the same ratios
    assert at[("lru", 0)] == pytest.approx(rec.evidence.token_hit_ratio.gpu_only, abs=1e-9)
    assert at[("lru", chosen_tokens)] == pytest.approx(rec.evidence.token_hit_ratio.cpu_lru_admit_all, abs=1e-9)


def test_each_act_records_its_own_budget_and_the_rule_names_its_baseline(demo):
    """The dashboard holds each act to its own budget: the demo records them per act."""
    out, stdout, _ = demo
    printed = [float(b) for b in re.findall(r"the rule's budget: TTFT p99 <= ([\d.]+) ms", stdout)]
    records = {}
    for path in (out / "rollouts").glob("*.json"):
        doc = json.loads(path.read_text())
        records[doc["act"]] = doc
    assert set(records) == {"agentic/", "chat/"}
    for act, budget_ms in zip(("agentic/", "chat/"), printed):
        phases = records[act]["phases"]
        assert phases and all(p["tiers"]["config_id"].startswith(act) for p in phases)
        assert {round(p["budget"]["ttft_p99_s"] * 1e3, 1) for p in phases} == {budget_ms}
    assert printed[0] != printed[1]  # two baselines, two budgets
    rec = from_json(json.loads((out / "recommendation" / "recommendation.json").read_text()))
    assert rec.evidence.rollback.baseline_tier_config == "agentic/gpu-only"


def test_analyze_and_recommend_say_one_verdict(demo):
    _, stdout, _ = demo
    analysed = re.search(r"Offloading verdict: (.+)", stdout).group(1).strip()
    recommended = re.search(r"^      verdict: (.+)$", stdout, re.M).group(1).strip()
    assert analysed == recommended == "offload"


def test_a_trace_where_offloading_does_not_pay_stops_after_the_baseline(tmp_path):
    trace = REPO / "kvtier" / "data" / "mooncake_conversation_trace.jsonl.gz"
    result = subprocess.run([sys.executable, "-m", "kvtier", "demo", "--out", str(tmp_path / "out"),
                             "--trace", str(trace), "--requests", "90", "--chat-requests", "0"],
                            capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "recommendation" / "recommendation.json").read_text())
    assert doc["evidence"]["verdict"] == "do_not_offload" and doc["settings"]["cpu_tier_bytes"] == 0
    skipped = re.search(r"^    trace/gpu\+cpu +skipped: (.+)$", result.stdout, re.M).group(1)
    held = [r["reason"] for r in doc["evidence"]["reasons"] if r["holds"]]
    assert skipped.startswith("do not offload: ") and all(name in skipped for name in held)
    assert "Offloading verdict: do not offload" in result.stdout  # analyze agrees
