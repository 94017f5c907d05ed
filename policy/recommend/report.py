"""Write a recommendation out: ``report.md`` with PNG plots, ``recommendation.json`` (and one
per engine, each readable by ``kvtier push --recommendation``), and the engine configs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from kvtier.collector import json_text
from kvtier.policy.recommend.plots import bar_chart, line_chart
from kvtier.policy.recommend.recommendation import Recommendation, settings_dict
from kvtier.policy.recommend.sizing import human_bytes
from kvtier.policy.recommend.values import HostCheck, TierSize
from kvtier.policy.writers import WRITERS, writer

CONFIG_FILES = {engine: module.DEFAULT_FILE for engine, module in WRITERS.items()}
RETENTION_FILE = "trtllm.retention.json"  # the gateway's per-request-class retention configs


def write(rec: Recommendation, out: Path, engines: Sequence[str]) -> list[Path]:
    """Every file for ``engines``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [_json(out / "recommendation.json", rec.to_json())]
    for engine in engines:
        settings = rec.for_engine(engine)
        if settings is None:
            continue
        written.append(_json(out / f"recommendation.{engine}.json", rec.to_json(engine)))
        rendered = writer(engine).render(settings, None, Path(CONFIG_FILES[engine]).suffix)
        path = out / CONFIG_FILES[engine]
        path.write_text(rendered.text)
        written.append(path)
        if engine == "trtllm" and settings.retention_ranges:
            path = out / RETENTION_FILE
            path.write_text(writer(engine).render(settings, None, ".json").text)
            written.append(path)
    plots = _plots(rec, out)
    report = out / "report.md"
    report.write_text(markdown(rec, [p.name for p in plots], engines))
    return written + plots + [report]


def markdown(rec: Recommendation, plots: Sequence[str], engines: Sequence[str]) -> str:
    """The human-readable report."""
    ev = rec.evidence
    lines = ["# kvtier recommendation", "", f"**Verdict: {rec.verdict.words}**", ""]
    if rec.verdict.note:
        lines += [f"_{rec.verdict.note}_", ""]
    lines += [f"- {r.sentence}" for r in rec.verdict.reasons] + [""]
    lines += ["## Settings", "", "| knob | value | why |", "|---|---|---|"]
    lines += [f"| `{k.name}` | {_value(k.value)} | {k.why} |" for k in rec.knobs]
    if ev.cpu_policy is not None:
        lines += ["", "## CPU tier admission and eviction", "", ev.cpu_policy.why]
    lines += inputs_section(rec)
    lines += latency_section(rec)
    lines += vs_gpu_section(rec)
    lines += rollback_section(rec)
    lines += sizes_section(rec)
    if rec.expected:
        lines += ["", "## Expected change on later time (vs. CPU tier LRU admitting all)", "",
                  ("Over the evaluated requests of the later period: tokens in total, TTFT "
                   "percentiles as the engine measures them (see Latency model); interval: "
                   "5th-95th percentile."), "",
                  "| metric | baseline | recommended | change | interval |", "|---|---|---|---|---|"]
        lines += [f"| {c.metric} | {c.baseline:.4g} | {c.candidate:.4g} | {c.change:+.4g} | "
                  f"[{c.low:+.4g}, {c.high:+.4g}] |" for c in rec.expected]
    lines += host_section(ev.host_memory, rec.settings.cpu_tier_bytes)
    lines += ["", "## Token hit ratio (later time)", ""]
    lines += [f"- {name}: {value:.4f}" for name, value in _ratios(rec).items()]
    if ev.model is not None:
        held = ev.model.held_out
        lines += ["", "## Model", "",
                  (f"Gradient-boosted classifier, isotonic calibration, seed {ev.seed}; "
                   f"held-out (latest training slice) ROC AUC {held.roc_auc}, Brier "
                   f"{held.brier:.4f}, {held.rows} rows. Re-trained deterministically "
                   "from the trace; no model file is loaded.")]
        if ev.model.weak:
            lines += ["", f"**Model flagged: {ev.model.weak}**; its scores set no threshold."]
    lines += ["", "## Engines", ""]
    for engine in engines:
        settings = rec.for_engine(engine)
        state = (f"`{CONFIG_FILES[engine]}`: `{json.dumps(settings_dict(settings))}`"
                 if settings else "no config written")
        lines.append(f"- **{engine}**: {state}")
    lines += [f"- note ({e}): {n}" for e, n in rec.engine_notes if e in engines]
    trtllm = rec.for_engine("trtllm") if "trtllm" in engines else None
    if trtllm is not None and trtllm.retention_ranges:
        lines += retention_section(trtllm)
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def inputs_section(rec: Recommendation) -> list[str]:
    """Every input the figures rest on and where it came from; the defaults called out."""
    inputs = rec.evidence.inputs
    if not inputs:
        return []
    lines = ["", "## Inputs and where they came from", "",
             "| input | value | source | observations | note |", "|---|---|---|---|---|"]
    lines += [f"| `{i.name}` | {i.value:,.6g} | {i.source} | "
              f"{'-' if i.observations is None else f'{i.observations:,}'} | {i.note} |" for i in inputs]
    defaults = rec.evidence.defaults()
    if defaults:
        lines += ["", "**Documented defaults, not measured:** "
                  + ", ".join(f"`{i.name}`" for i in defaults)
                  + ". `kvtier calibrate --out FILE` on a store fits the costs "
                  "(`--cost-params FILE`); `--gpu-tokens` and `--kv-bytes-per-token` give the rest."]
    return lines


def vs_gpu_section(rec: Recommendation) -> list[str]:
    """The recommended setting against the GPU tier alone: what turning it on changes."""
    changes = rec.evidence.expected_vs_gpu_only
    if not changes:
        return []
    lines = ["", "## Expected change against the GPU tier alone (later time)", "",
             "Over the evaluated requests of the later period: tokens in total, TTFT "
             "percentiles as the engine measures them (see Latency model), 5th-95th percentile "
             "intervals (paired: the same requests under both).", "",
             "| metric | GPU only | recommended | change | interval |", "|---|---|---|---|---|"]
    for c in changes:
        if c.metric.endswith("_s"):
            lines.append(f"| {c.metric.removesuffix('_s')} | {c.baseline * 1e3:.1f} ms | "
                         f"{c.candidate * 1e3:.1f} ms | {c.change * 1e3:+.1f} ms | "
                         f"[{c.low * 1e3:+.1f}, {c.high * 1e3:+.1f}] ms |")
        else:
            lines.append(f"| {c.metric} | {c.baseline:,.0f} | {c.candidate:,.0f} | "
                         f"{c.change:+,.0f} | [{c.low:+,.0f}, {c.high:+,.0f}] |")
    return lines


def latency_section(rec: Recommendation) -> list[str]:
    """Which latency model made the TTFT promise, and how; or why none was made."""
    card = rec.evidence.latency_model
    if card is None:
        return []
    lines = ["", "## Latency model", ""]
    if card.model is None:
        lines.append(f"**No TTFT is promised:** {card.why}.")
    else:
        lines.append(f"TTFT is promised by the **{card.model}** model ({card.why}): the "
                     f"{card.statistic}, median over {card.draws} noise draws, {card.interval} "
                     f"interval over draws x {card.resamples} resampled requests, {card.arrivals}-"
                     "loop arrivals.")
    if card.flag:
        lines += ["", f"**Flagged:** {card.flag}; it makes no promise."]
    if card.thin:
        lines += ["", "Costs on few observations (wider intervals): " + "; ".join(card.thin) + "."]
    return lines


def rollback_section(rec: Recommendation) -> list[str]:
    """The rollback rule to deploy with the settings, when budgets were given."""
    rule = rec.evidence.rollback
    if rule is None:
        return []
    itl = "" if rule.itl_p99_s is None else f" or the p99 ITL over {rule.itl_p99_s * 1e3:.1f} ms"
    return ["", "## Rollback rule to deploy with it", "",
            (f"Disable the newest tier when the p99 TTFT stays over {rule.ttft_p99_s * 1e3:.1f} ms"
             f"{itl} for {rule.sustained_s} s (p99 over {rule.window_s} s windows). "
             "`kvtier collect --emit-monitoring DIR` with the same budgets writes it as "
             "Prometheus alerting rules.")]


def sizes_section(rec: Recommendation) -> list[str]:
    """Each tier's size from the curve: knee, cap, chosen, and the next GiB's gain there."""
    sizes = rec.evidence.sizes
    if not sizes:
        return []
    lines = ["", "## Tier sizes from the curve", "",
             ("The knee is where the next GiB of a tier frees less than the threshold share of "
              "one prefill server's time (LRU curve of the requests, cost model); the "
              "size is the knee capped by what was measured."), "",
             "| tier | knee | cap | size | hit ratio without / at size | next GiB frees | threshold |",
             "|---|---|---|---|---|---|---|"]
    for t in sizes:
        cap = "not checked" if t.cap_bytes is None else human_bytes(t.cap_bytes)
        lines.append(f"| {t.tier} | {human_bytes(t.knee_bytes)} | {cap} | "
                     f"**{human_bytes(t.chosen_bytes)}** | {t.token_hit_ratio_without:.1%} / "
                     f"{t.token_hit_ratio_at_chosen:.1%} | {t.gain_per_gib_at_chosen:.3%} | "
                     f"{t.threshold_per_gib:.2%} |")
    lines += [""] + [f"- {t.tier}: {t.reason}" for t in sizes]
    return lines


def _value(value) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)


def _ratios(rec: Recommendation) -> dict[str, float]:
    ratios = rec.evidence.token_hit_ratio
    return {name: value for name, value in (
        ("gpu_only", ratios.gpu_only), ("cpu_lru_admit_all", ratios.cpu_lru_admit_all),
        ("cpu_learned_priority", ratios.cpu_learned_priority)) if value is not None}


def host_section(host: HostCheck, cpu_bytes: int | None) -> list[str]:
    """Whether the CPU size was checked against host memory, and what a cap cost."""
    lines = ["", "## Host memory", ""]
    if not host.checked:
        return lines + [(f"The CPU tier size ({_gib(cpu_bytes or 0)}) was **not checked against "
                         "host memory**: give `--headroom-json` (from `kvtier probe headroom "
                         "--json`) or `--host-headroom-bytes`.")]
    lines.append(f"Host headroom {_gib(host.headroom_bytes)} ({host.source}); safety "
                 f"margin {_gib(host.safety_margin_bytes)}; cap {_gib(host.cap_bytes)}.")
    if not host.capped:
        return lines + ["", f"The requested CPU tier ({_gib(host.requested_cpu_bytes)}) fits."]
    text = (f"**The requested CPU tier ({_gib(host.requested_cpu_bytes)}) was capped to "
            f"{_gib(host.recommended_cpu_bytes)}**; every figure in this report is measured at "
            "the capped size.")
    if host.token_hit_ratio_lru_at_requested is not None:
        text += (f" LRU token hit ratio on later time: "
                 f"{host.token_hit_ratio_lru_at_requested:.4f} at the requested size, "
                 f"{host.token_hit_ratio_lru_at_cap:.4f} at the cap.")
    return lines + ["", text]


def _gib(size_bytes: int) -> str:
    return f"{size_bytes / (1 << 30):.2f} GiB ({size_bytes} bytes)"


def retention_section(settings) -> list[str]:
    """The TensorRT-LLM per-request-class token-range priorities, as a table."""
    lines = ["", "## TensorRT-LLM retention per request class", "",
             (f"Send each class's entry of `{RETENTION_FILE}` as `kv_cache_retention_config` "
              "(LLM API, or Dynamo's TensorRT-LLM handler). A range's priority is the median "
              "learned priority of the blocks created at that prefix depth; a block whose "
              "priority reaches `offload_min_priority` is offloaded to host. A priority above "
              "the default 35 expires (`duration_ms`) when the learned score, decayed with the "
              "time since use at the rate chosen on the training period, falls to the "
              "default's; then TensorRT-LLM treats the block as 35."), "",
             "| request class | prompt tokens | priority | expires after |", "|---|---|---|---|"]
    for c in settings.retention_ranges:
        lines += [f"| {c.name} | {r.token_start}-{r.token_end if r.token_end is not None else 'end'} "
                  f"| {r.priority} | {_expiry(r.duration_ms)} |" for r in c.token_ranges]
        lines.append(f"| {c.name} | decode | {c.decode_priority} | "
                     f"{_expiry(c.decode_duration_ms)} |")
    return lines


def _expiry(duration_ms: int | None) -> str:
    return "never" if duration_ms is None else f"{duration_ms / 1000:g} s"


def _plots(rec: Recommendation, out: Path) -> list[Path]:
    """The PNGs, or none when Pillow is missing (it is not a declared dependency yet)."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        return []
    paths = []
    sweep = rec.evidence.sweep
    if sweep:
        series = {f"priority {c} threshold": [(p.min_priority, p.token_hit_ratio)
                                               for p in sweep if p.comparison == c]
                  for c in ("ge", "gt")}
        paths.append(line_chart(out / "threshold_sweep.png",
                                {k.replace("ge", ">=").replace("gt", ">"): v
                                 for k, v in series.items()},
                                "offload threshold sweep (validation slice)",
                                "offload_min_priority", "token hit ratio"))
    paths.append(bar_chart(out / "hit_ratio.png", _ratios(rec),
                           "token hit ratio on later time", "token hit ratio"))
    for size in rec.evidence.sizes:
        paths.append(_size_chart(out / f"{size.tier}_tier_curve.png", size))
    return paths


def _size_chart(path: Path, size: TierSize) -> Path:
    """Hit ratio against the tier's size (MiB), the chosen size as a vertical line."""
    mib = 1 << 20
    points = [(p.capacity_bytes / mib, p.token_hit_ratio) for p in size.curve]
    top = max([y for _, y in points] + [size.token_hit_ratio_at_chosen])
    series = {"token hit ratio (LRU curve)": points,
              f"chosen: {human_bytes(size.chosen_bytes)}": [(size.chosen_bytes / mib, 0.0),
                                                           (size.chosen_bytes / mib, top)]}
    return line_chart(path, series, f"{size.tier} tier: hit ratio against its size",
                      f"{size.tier} tier size (MiB)", "token hit ratio")


def _json(path: Path, data: dict) -> Path:
    return json_text.write(path, data)  # strict: a NaN is null

