"""The demo: the main job on embedded defaults, end to end on bundled real traces.

Act one replays agentic coding sessions (the bundled WEKA-format slice) through kvtier's
reference engine: the GPU tier alone first, whose measured tail sets the rollback budget;
then, from what that phase stored, ``kvtier analyze`` and ``kvtier recommend`` (this host's
memory headroom and file-read speed probed first) size the CPU and cold tiers from the
curve, and the rollout tries those sizes, each held to the budget. Act two replays chat
traffic (a Mooncake slice) whose reuse the demo's minutes cannot see, with the same CPU size
and a cold tier nobody sized, as a copied setting would: the rule decides. Every latency is
measured; everything lands in one DuckDB store and Parquet segments, what-if curves and the
recommendation beside them, for the dashboard.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvtier.demo.sized_plan import Sizes

ACT2 = "chat/"  # act one's phases are named after its workload: agentic/..., or trace/...
ROLLOUTS = "rollouts"  # one JSON per act: its phases, the budget each was held to, the rule's action
ENGINE_MODEL = "engine-model.json"  # the engine model calibrated on act one's GPU-only phase
UNSIZED_COLD_BLOCKS = 8192  # act two's cold tier: 64 MiB of the engine's blocks, sized by nobody


@dataclass(frozen=True, slots=True)
class DemoConfig:
    out_dir: Path
    trace: Path | None = None  # act one replays this trace instead of the agentic sessions
    requests: int | None = None  # act one's requests per phase (None: the whole slice)
    chat_requests: int = 300  # act two's requests per phase (0: no act two)
    recommend: bool = True  # run the analysis and the recommendation (else: sizes from the curve)


@dataclass(frozen=True)
class DemoResult:
    store: Path
    segments: Path
    acts: tuple  # kvtier.rollout.runner.RolloutReport per act
    recommendation: object | None  # kvtier.policy.recommend.recommendation.Recommendation
    seconds: float


def run_demo(config: DemoConfig, *, clock: Callable[[], float] = time.time, say=print) -> DemoResult:
    """Run the demo, printing as it goes; the result holds what it measured and decided."""
    from kvtier.collector.segments import export_segments
    from kvtier.collector.store import TraceStore
    from kvtier.demo import workloads
    from kvtier.demo.live import engine, run_act
    from kvtier.demo.sized_plan import SizedPlan
    from kvtier.demo.steps import measure_host
    from kvtier.progress import progress_lines

    started = time.perf_counter()
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    store_path, segments = out / "kvtier.duckdb", out / "segments"
    _clear_previous_run(out, say)
    act1 = workloads.agentic(config.requests, config.trace)
    records1 = act1.records()
    say(f"kvtier demo: act one, {act1.title}: {act1.describe(records1)}")
    block_bytes = act1.block_tokens * 512  # the reference engine's KV bytes per token
    say("  this host, probed:")
    probes = measure_host(out / "probes", block_bytes, say)
    decided: dict = {}
    with TraceStore(store_path, clock=clock) as store, \
            engine(store, out, act1.block_tokens, act1.gpu_blocks) as running:

        def size(baseline) -> Sizes:  # between the baseline and the tiers: decide their sizes
            running.flush()
            export_segments(store, segments)
            say(f"  {baseline.tiers.config_id} measured; the rollback budget it sets: "
                f"{_budget_text(plan.budget)}")
            decided["engine_model"] = _calibrate(store, f"{act1.name}/gpu-only", act1, out, say)
            sizes, rec = _decide(config, act1, segments, probes, plan.budget, out, say,
                                 None if decided["engine_model"] is None else out / ENGINE_MODEL)
            decided["recommendation"] = rec
            return sizes

        plan = SizedPlan(act1.gpu_blocks, size, prefix=f"{act1.name}/")
        with progress_lines(say) as progress:
            report1 = run_act(running, act1, records1, plan, store, progress)
        _show_act(report1, store, say)
        if decided.get("engine_model") is not None:
            _show_prediction(store, decided["engine_model"], f"{act1.name}/gpu-only", report1, say)
        promise = _show_promise(store, decided.get("recommendation"), act1.name, say)
        _write_rollout(report1, f"{act1.name}/", out / ROLLOUTS)
        rec, sizes = decided.get("recommendation"), plan.sizes
        if rec is not None and sizes is not None:
            _write_whatif(segments, act1, sizes.cpu_blocks, out / "whatif", say)
        reports = [report1]
        if config.chat_requests and sizes is not None and sizes.cpu_blocks:
            reports.append(_act_two(config, running, store, act1.gpu_blocks, sizes.cpu_blocks,
                                    say))
        running.flush()
        export_segments(store, segments)
        _store_line(store, store_path, segments, say)
    _clear_file_tier(out)
    elapsed = time.perf_counter() - started
    _close(rec, report1, out, segments, elapsed, say, promise)
    return DemoResult(store_path, segments, tuple(reports), rec, elapsed)


def _calibrate(store, baseline: str, act, out: Path, say):
    """The engine model fitted on the baseline phase's steps, its promotions priced by a
    canary (written to ``ENGINE_MODEL`` for recommend's ``--cost-params``); ``None``, said
    why, when the phase is too short to fit."""
    import tempfile

    from kvtier.demo.live import engine_config
    from kvtier.demo.prediction import calibrate_phase, promotion_cost

    config = engine_config(out, act.block_tokens, act.gpu_blocks)
    with tempfile.TemporaryDirectory(prefix="kvtier-canary-") as scratch:
        loaded_byte_s, promoting = promotion_cost(config, Path(scratch))
    try:
        params, requests, steps = calibrate_phase(
            store, baseline, act.gpu_blocks, out / ENGINE_MODEL,
            bytes_per_token=config.block_bytes // config.block_size_tokens, loaded_byte_s=loaded_byte_s,
            canary_steps=promoting)
    except ValueError as error:
        say(f"  the engine model is not calibrated ({error}); TTFT is priced by the queue model")
        return None
    say(f"  the engine model, calibrated on {baseline}'s {steps} steps and {requests} requests "
        f"-> {out / ENGINE_MODEL} (recommend --cost-params); a block promoted from a CPU tier "
        f"costs the engine's step {loaded_byte_s * config.block_bytes * 1e6:.0f} us (a canary "
        f"engine with a CPU tier, {promoting} promoting steps)")
    return params


def _show_prediction(store, params, baseline: str, report, say) -> None:
    from kvtier.demo.narration import prediction_lines
    from kvtier.demo.prediction import predicted_vs_measured

    rows = predicted_vs_measured(store, params, baseline, [p.tiers for p in report.phases])
    say(f"  the engine model's TTFT for each deployed configuration, over {baseline}'s requests "
        "(median of step-noise draws, 5th-95th percentile interval), beside the engine's own "
        "measurement (arrival at the engine to the first token):")
    for line in prediction_lines(rows):
        say(f"    {line}")


def _show_promise(store, rec, act: str, say) -> list:
    """The recommendation's own TTFT promise against what the engine measured on the same
    later share of the GPU-only phase and the phase with the recommended CPU tier."""
    from kvtier.demo.narration import promise_lines
    from kvtier.demo.prediction import promise_vs_measured

    if rec is None:
        return []
    rows = promise_vs_measured(store, rec, f"{act}/gpu-only", f"{act}/gpu+cpu")
    if rows:
        say("  the recommendation's own TTFT promise beside the engine's measurement, over the "
            "same later requests of each phase (ms):")
        for line in promise_lines(rows):
            say(f"    {line}")
    return rows


def _decide(config: DemoConfig, act, segments: Path, probes: dict, budget, out: Path, say,
            cost_params: Path | None = None) -> tuple[Sizes, object | None]:
    """The tier sizes for the rest of the rollout, from what the baseline stored; TTFT
    levels from the engine model when ``cost_params`` holds it."""
    if not config.recommend:
        return _curve_sizes(segments, act, say), None
    import json

    from kvtier.demo.steps import run_verb
    from kvtier.policy.recommend.recommendation import from_json

    select = ["--trace", str(segments), "--tier-config", f"{act.name}/gpu-only",
              "--source-engine", "load-probe", "--model", "kvtier-reference",
              "--gpu-tokens", str(act.gpu_blocks * act.block_tokens),
              "--ttft-slo-s", f"{budget.ttft_p99_s:.6g}", "--headroom-json", str(probes["headroom"])]
    say("  the analysis and the recommendation, over the requests the GPU-only phase served, "
        "with the costs the engine measured:")
    run_verb("analyze", [*select, "--out", str(out / "analysis")], say,
             show=lambda line: "verdict" in line.lower())
    reco = out / "recommendation"
    run_verb("recommend", [*select, "--itl-slo-s", f"{budget.itl_p99_s:.6g}",
                           "--engine", "all", "--fs-json", str(probes["fs"]),
                           "--cold-path", str((out / "file-tier").resolve()), "--out", str(reco),
                           *(["--cost-params", str(cost_params)] if cost_params else [])],
             say, show=lambda line: not line.startswith("wrote"))
    rec = from_json(json.loads((reco / "recommendation.json").read_text()))
    cpu, cold = rec.evidence.size("cpu"), rec.evidence.size("cold")
    if rec.verdict.outcome != "offload" or cpu is None:
        held = "; ".join(r.name for r in rec.verdict.reasons if r.holds)
        return Sizes(0, 0, cpu_reason=f"{rec.verdict.words}: {rec.verdict.note or held}"), rec
    return Sizes(cpu.chosen_blocks, 0 if cold is None else cold.chosen_blocks, cpu.reason,
                 "none considered" if cold is None else cold.reason), rec


def _curve_sizes(segments: Path, act, say) -> Sizes:
    """Without the recommendation: the CPU tier at the curve's knee, the cost model's
    defaults for the reference engine (no cold tier)."""
    from kvtier.policy.cost import CostParams
    from kvtier.policy.curves import lru_curve
    from kvtier.policy.geometry import geometry
    from kvtier.policy.readers import open_trace
    from kvtier.policy.recommend.sizing import tier_size

    records = list(open_trace(segments, tier_config_id=f"{act.name}/gpu-only",
                              engine="load-probe").requests())
    params = CostParams(model=geometry("kvtier-reference"))
    bt = act.block_tokens
    size = tier_size(lru_curve(records, bt), tier="cpu", offset_blocks=act.gpu_blocks,
                     block_bytes=bt * params.model.bytes_per_token,
                     saved_s_per_token=(params.recompute_s(bt) - params.promotion_s(bt, "cpu")) / bt,
                     span_s=records[-1].arrival_s - records[0].arrival_s if records else 0.0)
    say(f"  CPU tier from the curve (no recommendation asked): {size.reason}")
    return Sizes(size.chosen_blocks, 0, size.reason, "not asked for")


def _act_two(config: DemoConfig, running, store, gpu_blocks: int, cpu_blocks: int, say):
    from kvtier.demo import workloads
    from kvtier.demo.live import run_act
    from kvtier.demo.sized_plan import FixedPlan
    from kvtier.progress import progress_lines
    from kvtier.rollout.plan import PhaseTiers

    act = workloads.chat(config.chat_requests)
    records = act.records()
    say(f"kvtier demo: act two, {act.title}: {act.describe(records)}; the same CPU tier, and "
        f"a cold tier of {UNSIZED_COLD_BLOCKS} blocks that no curve asked for (a copied setting)")
    plan = FixedPlan(gpu_blocks, (PhaseTiers(f"{ACT2}gpu+cpu", gpu_blocks, cpu_blocks),
                                  PhaseTiers(f"{ACT2}gpu+cpu+cold", gpu_blocks, cpu_blocks,
                                             UNSIZED_COLD_BLOCKS)), prefix=ACT2)
    with progress_lines(say) as progress:
        report = run_act(running, act, records, plan, store, progress)
    _show_act(report, store, say)
    _write_rollout(report, ACT2, config.out_dir / ROLLOUTS)
    return report


def _show_act(report, store, say) -> None:
    from kvtier.demo.live import measured_costs
    from kvtier.demo.narration import budget_line, explain, phase_table

    budget = report.phases[0].budget if report.phases else None
    say(f"  measured on the engine (client side); the rule's budget: {budget_line(budget)}")
    for line in phase_table(report):
        say(f"    {line}")
    say("  what each phase shows:")
    for line in explain(report):
        say(f"    {line}")
    costs = measured_costs(store, [p.tiers.config_id for p in report.phases])
    if costs:
        say("  measured cost per token (median of the engine's block events): " + ", ".join(
            f"{name.replace('_', ' ')} {value:.2f} us" for name, value in sorted(costs.items())))


def _write_whatif(segments: Path, act, cpu_blocks: int, folder: Path, say) -> None:
    from kvtier.demo.whatif import write_cpu_sweep
    from kvtier.policy.readers import open_trace

    records = list(open_trace(segments, tier_config_id=f"{act.name}/gpu-only",
                              engine="load-probe").requests())
    path = write_cpu_sweep(records, act.gpu_blocks, cpu_blocks, folder)
    say(f"  what-if: hit ratio against CPU capacity per policy (Belady the bound) -> {path}")


def _write_rollout(report, act: str, folder: Path) -> None:
    """The act's rollout as the dashboard reads it (``kvtier.dashboard.artifacts.load_rollouts``):
    each act is held to its own budget, set by its own GPU-only phase."""
    from kvtier.collector import json_text

    folder.mkdir(parents=True, exist_ok=True)
    doc = {"act": act, **report.to_dict()}
    json_text.write(folder / f"{act.strip('/').replace('/', '_') or 'rollout'}.json", doc, indent=1)


def _budget_text(budget) -> str:
    from kvtier.demo.narration import budget_line

    return budget_line(budget)


def _store_line(store, store_path: Path, segments: Path, say) -> None:
    row = store.query("""
        SELECT (SELECT count(*) FROM requests) AS requests,
               (SELECT count(*) FROM block_events) AS block_events,
               (SELECT count(*) FROM ingested_batches) AS batches,
               (SELECT coalesce(sum(rejected), 0) FROM ingested_batches) AS rejected
    """).to_pylist()[0]
    say(f"  stored {row['block_events']:,} block events and {row['requests']:,} request records in "
        f"{row['batches']} batches ({row['rejected']} rejected) in {store_path}; segments in {segments}")


def _close(rec, report1, out: Path, segments: Path, elapsed: float, say, promise=()) -> None:
    from kvtier.demo.narration import closing

    say(f"kvtier demo: summary ({elapsed:.0f} s)")
    if rec is not None:
        for line in closing(rec, report1, str(out / "recommendation" / "recommendation.json"),
                            str(out / "monitoring"), promise):
            say(f"  {line}")
    say(f"  open the dashboard: kvtier dashboard --segments {segments}")


def _clear_previous_run(out: Path, say) -> None:
    """A demo run starts from an empty store and folders, so its figures describe it alone."""
    import shutil

    store = out / "kvtier.duckdb"
    if store.exists():
        _check_replaceable(store)
    if store.exists() or (out / "segments").exists():
        say(f"kvtier demo: replacing the previous demo run in {out}")
    for path in (store, store.with_name(store.name + ".wal")):
        path.unlink(missing_ok=True)
    for name in ("segments", "whatif", "recommendation", "analysis", "file-tier", ROLLOUTS):
        shutil.rmtree(out / name, ignore_errors=True)
    (out / ENGINE_MODEL).unlink(missing_ok=True)


def _check_replaceable(store_path: Path) -> None:
    """The demo replaces its own previous store, never someone else's file: raise unless
    ``store_path`` is a kvtier store (of any schema) that no process holds."""
    from kvtier.collector.storefile import NotAStoreError, StoreSchemaError, connect

    try:
        connect(store_path, read_only=True).close()
    except StoreSchemaError:
        pass  # an older kvtier's store: still the demo's own kind of file
    except NotAStoreError:
        raise ValueError(f"--out {store_path.parent}: {store_path.name} there is not a kvtier "
                         "store, and the demo would replace it; choose another --out") from None


def _clear_file_tier(out: Path) -> None:
    """The engine's file-tier blocks are of no use once it stopped."""
    import shutil

    shutil.rmtree(out / "file-tier", ignore_errors=True)
