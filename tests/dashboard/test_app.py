"""Every page through Streamlit's AppTest: charts exist, carry the right fields and rows,
and empty, simulated-only and mid-rollout data render an explanation instead of a blank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from kvtier import dashboard
from kvtier.dashboard.sources import ENV_RECOMMENDATION, ENV_SEGMENTS, ENV_WHATIF
from kvtier.dashboard.views import PAGES
from kvtier.policy.recommend.recommendation import from_json
from kvtier.policy.writers.vllm_shape import check
from tests.dashboard.fixtures import PHASES, build_two_loads, write_recommendation

WRITER = Path(__file__).resolve().parents[1] / "collector" / "writer_process.py"
APP = str(Path(dashboard.__file__).with_name("app.py"))
pytestmark = pytest.mark.timeout(120)


def open_page(monkeypatch, segments, page, tmp_path=None, **folders) -> AppTest:
    monkeypatch.setenv(ENV_SEGMENTS, str(segments))
    for env, key in ((ENV_WHATIF, "whatif"), (ENV_RECOMMENDATION, "recommendation")):
        monkeypatch.setenv(env, str(folders.get(key, segments.parent / f"no-{key}")))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["page"] = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at) -> list[tuple[dict, pa.Table]]:
    """Each chart's spec and the rows it was given."""
    return [(json.loads(c.proto.spec), pa.ipc.open_stream(c.proto.data.data).read_all())
            for c in at.get("vega_lite_chart")]


def test_overview_charts_outcomes_per_configuration(monkeypatch, full_segments):
    at = open_page(monkeypatch, full_segments, "overview")
    (totals_spec, totals), (time_spec, over_time), (events_spec, events) = charts(at)
    assert totals_spec["encoding"]["x"]["title"] == "share of tokens"  # the headline: tokens
    assert events_spec["encoding"]["x"]["title"] == "share of blocks"  # lookups, second
    assert set(events.column("tier_config").to_pylist()) == set(PHASES)
    assert totals_spec["encoding"]["y"]["field"] == "tier_config"
    assert totals_spec["encoding"]["color"]["scale"]["domain"][0] == "gpu_hit"
    assert set(totals.column("tier_config").to_pylist()) == set(PHASES)
    assert time_spec["encoding"]["x"]["type"] == "temporal"
    assert time_spec["encoding"]["row"]["field"] == "tier_config"
    assert time_spec["encoding"]["row"]["sort"] == list(PHASES)  # rollout order, not alphabetical
    assert over_time.num_rows > 20 and "cold_promotion" in over_time.column("outcome").to_pylist()
    # the headline: one row of shares per configuration, in rollout order, none blended
    outcomes = ["gpu hit", "cpu promotion", "cold promotion", "recompute miss"]
    assert [m.label for m in at.metric] == outcomes * len(PHASES)
    assert [m.value for m in at.markdown if m.value.startswith("**`")] == [f"**`{p}`**" for p in PHASES]
    amounts = {(c, o): a for c, o, a in zip(totals.column("tier_config").to_pylist(),
                                             totals.column("outcome").to_pylist(),
                                             totals.column("amount").to_pylist())}
    for phase, shown in zip(PHASES, [at.metric[i:i + 4] for i in range(0, len(at.metric), 4)]):
        whole = sum(a for (c, _), a in amounts.items() if c == phase)
        assert [m.value for m in shown] == [
            f"{amounts.get((phase, o.replace(' ', '_')), 0) / whole:.1%}" for o in outcomes]
    assert len(at.dataframe) == 1  # the table comes after the charts
    assert list(dict.fromkeys(at.dataframe[0].value["tier_config"])) == list(PHASES)


def test_sidebar_filter_narrows_the_charts(monkeypatch, full_segments):
    at = open_page(monkeypatch, full_segments, "overview")
    configs = next(m for m in at.sidebar.multiselect if m.label == "Tier configuration")
    configs.set_value(["gpu-only"]).run()
    (_, totals), *_ = charts(at)
    assert set(totals.column("tier_config").to_pylist()) == {"gpu-only"}


def test_latency_page_charts_promotions_and_request_latency(monkeypatch, full_segments):
    at = open_page(monkeypatch, full_segments, "latency")
    (promo_spec, promo), (ttft_spec, ttft), (_, itl), (time_spec, ttft_p99), _ = charts(at)
    assert promo_spec["encoding"]["x"]["field"] == "source_tier"
    assert promo_spec["encoding"]["xOffset"]["field"] == "quantile"
    assert set(promo.column("source_tier").to_pylist()) == {"cpu", "cold", "recompute"}
    assert set(ttft.column("metric").to_pylist()) == {"ttft"} and set(itl.column("metric").to_pylist()) == {"itl"}
    assert ttft_spec["encoding"]["y"]["field"] == "latency_ms"
    assert time_spec["encoding"]["x"]["type"] == "temporal" and time_spec["encoding"]["color"]["sort"] == list(PHASES)
    assert set(ttft_p99.column("tier_config").to_pylist()) == set(PHASES)


def test_latency_page_names_the_wait_per_job_and_the_engines_copy_time_apart(monkeypatch, tmp_path):
    at = open_page(monkeypatch, build_two_loads(tmp_path / "segments"), "latency")
    titles = [h.value for h in at.subheader]
    assert "Load wait per job by source tier (request path)" in titles
    assert "Copy time per load job (engine-measured)" in titles
    (_, wait), *_ = charts(at)
    assert set(wait.column("jobs").to_pylist()) == {2}  # two loads of six blocks
    copy = at.dataframe[-1].value
    assert copy["mean_copy_ms"].tolist() == pytest.approx([3.0])


def test_reuse_page_charts_sharing_positions_and_reuse_times(monkeypatch, full_segments):
    at = open_page(monkeypatch, full_segments, "reuse")
    (classes_spec, classes), (_, positions), (gaps_spec, gaps), (size_spec, sizes) = charts(at)
    assert classes_spec["encoding"]["x"]["field"] == "reuse_class" and classes.num_rows >= 2
    assert positions.num_rows > 3
    assert gaps_spec["encoding"]["x"]["scale"]["type"] == "log" and gaps.num_rows > 0
    assert "never reused" in [m.label for m in at.metric]
    assert size_spec["encoding"]["x"]["field"] == "job_bytes"
    assert sorted(set(sizes.column("job_bytes").to_pylist())) == [1024 * 1024, 2 * 1024 * 1024]


@pytest.mark.parametrize("page", ["overview", "latency", "reuse"])
def test_empty_folder_explains_how_to_get_data(monkeypatch, empty_segments, page):
    at = open_page(monkeypatch, empty_segments, page)
    assert not at.get("vega_lite_chart")
    assert "kvtier demo" in at.info[0].value


def test_simulated_only_data_says_so_and_explains_missing_latency(monkeypatch, simulated_segments):
    overview = open_page(monkeypatch, simulated_segments, "overview")
    assert "simulated replays" in overview.info[0].value
    spec, rows = charts(overview)[0]
    assert spec["encoding"]["x"]["title"] == "share of tokens"
    # outcomes with no tokens have no row, as outcomes with no events have none
    assert sorted(rows.column("outcome").to_pylist()) == ["gpu_hit", "recompute_miss"]
    latency = open_page(monkeypatch, simulated_segments, "latency")
    assert not latency.get("vega_lite_chart")
    assert any("No promotion" in i.value for i in latency.info)
    assert any("TTFT" in i.value or "inter-token" in i.value for i in latency.info)


def test_mid_rollout_flags_the_newest_configuration(monkeypatch, mid_rollout_segments):
    for page in ("overview", "latency"):
        at = open_page(monkeypatch, mid_rollout_segments, page)
        assert "Rollout in progress" in at.warning[0].value and "gpu+cpu+cold" in at.warning[0].value
        assert at.get("vega_lite_chart")
    latency = open_page(monkeypatch, mid_rollout_segments, "latency")
    assert any("Provisional" in c.value and "gpu+cpu+cold" in c.value for c in latency.caption)


@pytest.mark.parametrize("page, command", [("whatif", "kvtier simulate"), ("recommendation", "kvtier recommend")])
def test_planning_pages_explain_how_to_produce_their_inputs(monkeypatch, full_segments, page, command):
    at = open_page(monkeypatch, full_segments, page)
    assert not at.get("vega_lite_chart") and command in at.info[0].value


def test_whatif_page_draws_curves_with_bound_and_chosen_point(monkeypatch, full_segments, tmp_path):
    points = [{"policy": p, "cpu_capacity_tokens": c, "token_hit_ratio": r}
              for p in ("lru", "belady") for c, r in ((1e5, 0.2), (1e6, 0.5))]
    (tmp_path / "sweep.json").write_text(json.dumps(
        {"points": points, "chosen": {"policy": "lru", "cpu_capacity_tokens": 1e6}}))
    at = open_page(monkeypatch, full_segments, "whatif", whatif=tmp_path)
    (spec, rows), = charts(at)
    assert spec["layer"][0]["encoding"]["strokeDash"]["field"] == "bound"
    assert spec["layer"][0]["encoding"]["x"]["title"].startswith("CPU")
    assert rows.num_rows == 4 and rows.column("chosen").to_pylist().count(True) == 1
    assert set(rows.column("bound").to_pylist()) == {"bound", "policy"}


def test_whatif_page_draws_the_demos_sweep_with_the_recommended_policy(monkeypatch, full_segments, tmp_path):
    from kvtier.demo.whatif import POLICIES, write_cpu_sweep
    from tests.policy.learn.synthetic import conversations

    write_cpu_sweep(conversations(300, seed=4), gpu_blocks=32, chosen_blocks=96, folder=tmp_path)
    at = open_page(monkeypatch, full_segments, "whatif", whatif=tmp_path)
    (spec, rows), = charts(at)
    assert "recommended" in POLICIES and set(rows.column("policy").to_pylist()) == set(POLICIES)
    assert spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == sorted(POLICIES)
    assert any("recommended: what the recommendation deploys" in c.value for c in at.caption)


@pytest.mark.timeout(240)
def test_whatif_page_reads_real_kvtier_simulate_output(monkeypatch, full_segments, tmp_path):
    trace = Path(dashboard.__file__).parents[1] / "kvtier" / "data" / "mooncake_conversation_trace.jsonl.gz"
    runs = {"lru-sweep.json": ["--sweep", "--policy", "lru"],
            "lru-cpu.json": ["--gpu-tokens", "200000", "--cpu-tokens", "2000000", "--policy", "lru"]}
    for name, argv in runs.items():
        result = subprocess.run([sys.executable, "-m", "kvtier", "simulate", "--trace", str(trace), *argv, "--json"],
                                capture_output=True, text=True, timeout=180, check=False)
        assert result.returncode == 0, result.stderr
        (tmp_path / name).write_text(result.stdout)
    at = open_page(monkeypatch, full_segments, "whatif", whatif=tmp_path)
    (_, cpu_rows), (gpu_spec, gpu_rows) = charts(at)
    assert cpu_rows.num_rows == 1 and cpu_rows.column("capacity_tokens").to_pylist() == [2_000_000 // 512 * 512]
    assert gpu_spec["layer"][0]["encoding"]["x"]["title"].startswith("GPU") and gpu_rows.num_rows > 3
    assert all(0 <= r <= 1 for r in gpu_rows.column("token_hit_ratio").to_pylist())


def test_malformed_whatif_file_is_named_in_an_error(monkeypatch, full_segments, tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps([{"policy": "lru"}]))
    at = open_page(monkeypatch, full_segments, "whatif", whatif=tmp_path)
    assert "bad.json" in at.error[0].value


def test_recommendation_leads_with_settings_and_the_absolute_ttft_change(monkeypatch, full_segments,
                                                                         tmp_path):
    folder = write_recommendation(tmp_path / "reco", ttft_p99_budget_s=0.001)
    rec = from_json(json.loads((folder / "recommendation.json").read_text()))
    at = open_page(monkeypatch, full_segments, "recommendation", recommendation=folder)
    assert "Verdict: offload" in at.success[0].value and "prompts are unique" in at.success[0].value
    headers = [h.value for h in at.subheader]
    assert headers[:2] == ["What to set", "Time to first token against the GPU tier alone"]
    settings = at.table[0].value
    assert list(settings.index) == [k.name for k in rec.knobs]
    # each engine's CPU tier as it receives it: vLLM's holds a copy of the GPU's blocks too
    vllm_bytes, neutral_bytes = rec.for_engine("vllm").cpu_tier_bytes, rec.settings.cpu_tier_bytes
    assert vllm_bytes > neutral_bytes
    assert settings["value"].iloc[0] == (
        f"vllm: {vllm_bytes:,} ({vllm_bytes / 2**20:,.2f} MiB); trtllm, lmcache, sglang, dynamo: "
        f"{neutral_bytes:,} ({neutral_bytes / 2**20:,.2f} MiB)")
    p99 = next(m for m in at.metric if m.label == "TTFT p99 change")
    change = next(c for c in rec.evidence.expected_vs_gpu_only if c.metric == "ttft_p99_s")
    assert p99.value == f"{change.change * 1e3:+.1f} ms"  # absolute, in ms
    assert f"[{change.low * 1e3:+.1f}, {change.high * 1e3:+.1f}] ms" in p99.delta  # its interval
    # a decrease of TTFT, all of its interval below zero: a down arrow, green (lower is better)
    assert change.high < 0
    assert (p99.proto.direction, p99.proto.color) == (p99.proto.DOWN, p99.proto.GREEN)
    (ttft_spec, ttft), (cpu_spec, cpu_curve), *rest = charts(at)
    assert ttft_spec["layer"][2]["encoding"]["x"]["title"] == "change in time to first token (ms)"
    assert ttft.column("change_ms").to_pylist()[2] == pytest.approx(change.change * 1e3)
    assert ttft.column("low_ms").to_pylist()[2] == pytest.approx(change.low * 1e3)
    assert cpu_spec["layer"][1]["mark"]["type"] == "rule"  # the chosen size
    chosen = rec.evidence.size("cpu").chosen_bytes / 2**30  # the curve reaches GiBs: in GiB
    assert cpu_spec["layer"][0]["encoding"]["x"]["title"] == "cpu tier size (GiB)"
    assert cpu_curve.column("capacity").to_pylist()[cpu_curve.column("chosen").to_pylist().index(True)] \
        == pytest.approx(chosen)
    tokens_spec, tokens = rest[-1]  # relative changes of token counts come last, below
    assert set(tokens.column("metric").to_pylist()) <= {"gpu_hit_tokens", "cpu_promotion_tokens",
                                                       "cold_promotion_tokens", "recompute_tokens"}
    codes = [c.value for c in at.code]  # engine configs, not the push JSONs
    assert any("host_cache_size" in c for c in codes)
    (shown,) = [json.loads(c) for c in codes if "kv_connector" in c]
    # vLLM's copy records: kvtier's connector and spec, as a push into such a config writes it
    assert (shown["kv_connector"], shown["kv_connector_module_path"]) == (
        "KvtierOffloadingConnector", "kvtier.probes.vllm.connector")
    extra = shown["kv_connector_extra_config"]
    assert (extra["spec_module_path"], extra["spec_name"]) == ("kvtier.probes.vllm.spec",
                                                                "KvtierCPUOffloadingSpec")
    assert extra["cpu_bytes_to_use"] == vllm_bytes
    check(shown)  # it would boot vLLM
    assert any("over budget" in m.value for m in at.markdown)


def test_recommendation_without_budgets_says_there_is_no_rule(monkeypatch, full_segments, tmp_path):
    folder = write_recommendation(tmp_path / "reco", ttft_p99_budget_s=None)
    at = open_page(monkeypatch, full_segments, "recommendation", recommendation=folder)
    assert any("no rollback budgets" in i.value for i in at.info)


CHECKED = {"tier_config": "gpu+cpu:12779520", "requests": 80, "needed": 80, "more_needed": 0,
           "warmup": 37, "basis": "vLLM's CPU tier", "held": False, "promises": [
               {"metric": "token_hit_ratio", "predicted": 0.89, "low": 0.87, "high": 0.91,
                "measured": 0.89, "held": True},
               {"metric": "ttft_p99_s", "predicted": 0.026, "low": 0.016, "high": 0.036,
                "measured": 0.073, "held": False}]}


def test_recommendation_shows_what_its_check_said(monkeypatch, full_segments, tmp_path):
    folder = write_recommendation(tmp_path / "reco", ttft_p99_budget_s=None)
    (folder / "recommendation.check.json").write_text(json.dumps(CHECKED))
    at = open_page(monkeypatch, full_segments, "recommendation", recommendation=folder)
    assert any("A prediction did not hold: 80 requests under `gpu+cpu:12779520`" in e.value
               for e in at.error)
    held = [t for t in at.table if "ttft_p99_s" in t.value.index][0].value
    assert list(held["held"]) == ["held", "outside"]
    assert all('"tier_config"' not in c.value for c in at.code)  # not shown as an engine config


HELD_OUT = {"split_s": 1000.0, "by_tier_config": [
    {"tier_config_id": "gpu+cpu:8388608", "requests": 40,
     "measured": {"ttft_p50_s": 0.0407, "ttft_p95_s": 0.0711, "ttft_p99_s": 0.0732,
                  "itl_p50_s": 0.0171, "itl_p99_s": 0.0217},
     "predicted": {"ttft_p50_s": 0.0492, "ttft_p95_s": 0.0732, "ttft_p99_s": 0.0813,
                   "itl_p50_s": 0.0152, "itl_p99_s": 0.0193},
     "ratio": {"ttft_p50_s": 1.21, "ttft_p95_s": 1.03, "ttft_p99_s": 1.11, "itl_p50_s": 0.89,
               "itl_p99_s": 0.89}}]}


def test_recommendation_shows_how_well_the_latency_model_predicted_this_engine(
        monkeypatch, full_segments, tmp_path):
    from kvtier.collector.exports.recommendation import CALIBRATION_FILE
    from kvtier.verbs.recommend import _calibration

    from kvtier.policy.latency.costfile import CostFile

    folder = write_recommendation(tmp_path / "reco", ttft_p99_budget_s=None)
    written = _calibration(CostFile(held_out=HELD_OUT), folder)  # the costs recommend rests on
    assert folder / CALIBRATION_FILE in written and folder / "cost-params.json" in written
    at = open_page(monkeypatch, full_segments, "recommendation", recommendation=folder)
    assert "How well the latency model predicts this engine" in [h.value for h in at.subheader]
    table = [t for t in at.table if "predicted / measured" in t.value.columns][0].value
    p50 = table.loc[("gpu+cpu:8388608", "ttft_p50_s")]
    assert (p50["predicted (ms)"], p50["measured (ms)"], p50["predicted / measured"]) == \
        pytest.approx((49.2, 40.7, 1.21))
    assert all("held_out" not in c.value and "by_tier_config" not in c.value for c in at.code)
    assert _calibration(None, folder) == []  # no --cost-params: nothing beside it


def test_a_recommendation_in_another_format_is_shown_raw_with_the_reason(monkeypatch, full_segments,
                                                                         tmp_path):
    folder = tmp_path / "reco"
    folder.mkdir()
    (folder / "recommendation.json").write_text(json.dumps({"kind": "kvtier.recommendation",
                                                            "version": 1, "settings": {}}))
    at = open_page(monkeypatch, full_segments, "recommendation", recommendation=folder)
    assert "not in `kvtier recommend`'s format" in at.warning[0].value and "version 1" in at.warning[0].value
    assert '"version": 1' in at.code[0].value


def test_every_page_is_reachable_from_the_sidebar(monkeypatch, full_segments):
    at = open_page(monkeypatch, full_segments, "overview")
    for slug, (title, _) in PAGES.items():
        at.sidebar.radio[0].set_value(slug).run()
        assert at.title[0].value.endswith(title) and not at.exception


def test_overview_renders_while_a_collector_process_holds_the_store(monkeypatch, tmp_path):
    segments = tmp_path / "segments"
    writer = subprocess.Popen([sys.executable, str(WRITER), str(tmp_path / "store.duckdb"), "--batches", "3",
                               "--rows", "50", "--segments", str(segments), "--hold-s", "60"],
                              stdout=subprocess.PIPE, text=True)
    try:
        lines = [writer.stdout.readline().strip() for _ in range(4)]  # ACK 0..2, then HOLDING
        assert lines == ["ACK 0", "ACK 1", "ACK 2", "HOLDING"]
        at = open_page(monkeypatch, segments, "overview")  # the store file is locked right now
        (_, totals), _ = charts(at)
        assert sum(totals.column("amount").to_pylist()) == 150
        assert writer.poll() is None  # the writer was never disturbed
    finally:
        writer.kill()
        writer.wait(timeout=30)


def test_time_range_slider_limits_the_overview_to_the_early_phase(monkeypatch, full_segments):
    at = open_page(monkeypatch, full_segments, "overview")
    slider = at.sidebar.slider[0]
    start, end = slider.value
    slider.set_value((start, start + (end - start) / 4)).run()  # the first quarter: GPU only
    (_, totals), (_, over_time), *_ = charts(at)
    assert set(totals.column("tier_config").to_pylist()) == {"gpu-only"}
    assert "cpu_promotion" not in over_time.column("outcome").to_pylist()


def test_new_segments_show_up_on_the_next_run_despite_caching(monkeypatch, tmp_path, store, origin):
    from kvtier.collector.batch import EventBatch
    from kvtier.collector.events import BlockEvent, Outcome
    from kvtier.collector.segments import export_segments

    def ingest(sequence: int, blocks: int) -> None:
        events = [BlockEvent(1_800_000_000.0 + sequence * 60 + i, Outcome.GPU_HIT, 1000 * sequence + i,
                             request_id=f"r{sequence}", position=i) for i in range(blocks)]
        store.ingest(EventBatch.from_rows(origin, sequence, events))
        export_segments(store, tmp_path / "segments")

    ingest(0, 5)
    at = open_page(monkeypatch, tmp_path / "segments", "overview")
    assert sum(charts(at)[0][1].column("amount").to_pylist()) == 5
    ingest(1, 7)
    at.run()
    assert sum(charts(at)[0][1].column("amount").to_pylist()) == 12


def test_recommendation_says_whether_host_memory_was_checked_and_why_the_file_tier(
        monkeypatch, full_segments, tmp_path):
    folder = write_recommendation(tmp_path / "reco")
    at = open_page(monkeypatch, full_segments, "recommendation", recommendation=folder)
    warnings = [w.value for w in at.warning]
    assert any("not checked against host memory" in w for w in warnings)
    assert any(w.startswith("vLLM file tier: ") for w in warnings + [s.value for s in at.success])
    doc = json.loads((folder / "recommendation.json").read_text())
    doc["evidence"]["host_memory"] = {
        "checked": True, "source": "kvtier probe headroom", "headroom_bytes": 20 * 2**30,
        "safety_margin_bytes": 2 * 2**30, "cap_bytes": 18 * 2**30,
        "requested_cpu_bytes": 305 * 2**30, "recommended_cpu_bytes": 18 * 2**30, "capped": True,
        "token_hit_ratio_lru_at_requested": 0.163, "token_hit_ratio_lru_at_cap": 0.059}
    (folder / "recommendation.json").write_text(json.dumps(doc))
    at = open_page(monkeypatch, full_segments, "recommendation", recommendation=folder)
    info = " ".join(i.value for i in at.info)
    assert "305.0 GiB the curve asked for was capped to 18.0 GiB" in info and "16.3% at the asked size" in info
