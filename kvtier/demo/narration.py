"""What the demo prints: the phases, what each one shows, and the closing summary (what to
set, the expected TTFT change with its interval, the rollback rule to deploy with it).

Every figure comes from a rollout report (measured on the engine, client side) or from the
recommendation (:class:`kvtier.policy.recommend.recommendation.Recommendation`, as written to
``recommendation.json``); nothing here computes a new one.
"""

from __future__ import annotations

from kvtier.demo.sized_plan import BUDGET_MARGIN
from kvtier.policy.recommend.recommendation import Recommendation
from kvtier.policy.recommend.sizing import human_bytes
from kvtier.policy.rollback.rule import LatencyBudget

def phase_table(report) -> list[str]:
    """One line per phase: where prompt tokens came from, TTFT and ITL, and what the rule
    compares with the budget: the highest p99 (TTFT, ITL) the phase held for the sustained
    interval, over the rule's windows."""
    lines = [f"{'phase':22s} {'reqs':>5s} {'GPU hit':>8s} {'CPU prom':>9s} {'cold prom':>10s} "
             f"{'recompute':>10s} {'TTFT p50':>9s} {'p99':>9s} {'ITL p99':>9s} "
             f"{'held p99 TTFT/ITL':>20s}  rule"]
    for phase in report.phases:
        s, ttft, itl = phase.summary["shares"], phase.summary["ttft_s"], phase.summary["itl_s"]
        lines.append(f"{phase.tiers.config_id:22s} {len(phase.records):5d} {s['gpu_hit']:8.1%} "
                     f"{s['cpu_promotion']:9.1%} {s['cold_promotion']:10.1%} "
                     f"{s['recomputed']:10.1%} {_ms(ttft['p50']):>9s} {_ms(ttft['p99']):>9s} "
                     f"{_ms(itl['p99']):>9s} {_held(phase):>20s}  {phase.action}")
    lines += [f"{config_id:22s} skipped: {reason}" for config_id, reason in report.skipped]
    return lines


def _held(phase) -> str:
    from kvtier.policy.rollback.decide import sustained_p99

    budget = phase.budget
    if budget is None:
        return "-"
    held = [sustained_p99(phase.records, metric, budget.window_s, budget.sustained_s)
            for metric in ("ttft", "itl")]
    return " / ".join(_ms(v) for v in held)


def budget_line(budget: LatencyBudget | None) -> str:
    if budget is None:
        return "no budget: the baseline did not run"
    return (f"TTFT p99 <= {_ms(budget.ttft_p99_s)}, ITL p99 <= {_ms(budget.itl_p99_s)} "
            f"(p99 over {budget.window_s} s windows, a breach must last {budget.sustained_s} s: "
            f"{BUDGET_MARGIN:g} x the highest p99 the GPU-only phase held that long)")


def explain(report) -> list[str]:
    """What each phase shows, in words, from its own figures against the one before it."""
    lines, before = [], None
    for phase in report.phases:
        s, ttft = phase.summary["shares"], phase.summary["ttft_s"]
        served = s["gpu_hit"] + s["cpu_promotion"] + s["cold_promotion"]
        if before is None:
            text = (f"the GPU tier alone serves {served:.0%} of prompt tokens and recomputes "
                    f"{s['recomputed']:.0%}; its tail sets the budget")
        else:
            b, bt = before.summary["shares"], before.summary["ttft_s"]
            was = b["gpu_hit"] + b["cpu_promotion"] + b["cold_promotion"]
            text = (f"served from cache {was:.0%} -> {served:.0%}, recompute "
                    f"{b['recomputed']:.0%} -> {s['recomputed']:.0%}, TTFT p50 "
                    f"{_ms(bt['p50'])} -> {_ms(ttft['p50'])}, p99 {_ms(bt['p99'])} -> "
                    f"{_ms(ttft['p99'])}; held p99 {_held(phase)}: {_action_words(phase.action)}")
        lines.append(f"{phase.tiers.config_id}: {text}")
        before = phase if not phase.rolled_back else before
    return lines


def _action_words(action: str) -> str:
    if action == "keep":
        return "within budget, kept"
    return f"over budget, the rule says {action}"


def closing(rec: Recommendation, act: object, reco_path: str, emit_dir: str,
            promise=()) -> list[str]:
    """The summary: what to set (as recommendation.json has it), the change measured on the
    engine and expected by replay, and the rollback rule with the budget the baseline set."""
    lines = [f"verdict: {rec.verdict.words}" + (f" ({rec.verdict.note})" if rec.verdict.note else "")]
    lines.append(f"what to set ({reco_path}):")
    for knob in rec.knobs:
        value = list(knob.value) if isinstance(knob.value, tuple) else knob.value
        if knob.name.endswith("_bytes") and isinstance(value, int) and value:
            value = f"{value} ({human_bytes(value)})"
        lines.append(f"  {knob.name} = {value}")
    for size in rec.evidence.sizes:
        lines.append(f"  {size.tier} tier size: {size.reason}")
    cold = rec.evidence.vllm_file_tier
    if cold is not None:
        lines.append(f"  cold tier cost: {cold.cost.text}")
    lines += _measured(act)
    lines += _expected(rec, promise)
    rule = rec.evidence.rollback
    if rule is not None:
        itl = "" if rule.itl_p99_s is None else f" or ITL p99 > {_ms(rule.itl_p99_s)}"
        flags = f"--ttft-p99-budget-s {rule.ttft_p99_s:.3g}" + (
            "" if rule.itl_p99_s is None else f" --itl-p99-budget-s {rule.itl_p99_s:.3g}")
        lines.append(f"rollback rule to deploy with it (the budget the GPU-only phase set): "
                     f"disable the newest tier when TTFT p99 > {_ms(rule.ttft_p99_s)}{itl} for "
                     f"{rule.sustained_s} s ({rule.window_s} s windows); `kvtier collect "
                     f"--emit-monitoring {emit_dir} {flags}` writes it as Prometheus alerts")
    return lines


def _measured(act) -> list[str]:
    phases = {p.tiers.config_id.rsplit("/", 1)[-1]: p for p in act.phases}
    base, cpu = phases.get("gpu-only"), phases.get("gpu+cpu")
    if base is None or cpu is None:
        return []
    b, c = base.summary, cpu.summary
    served = lambda s: s["gpu_hit"] + s["cpu_promotion"] + s["cold_promotion"]  # noqa: E731
    return [f"measured on the engine, GPU only -> +CPU tier: GPU+CPU served "
            f"{served(b['shares']):.1%} -> {served(c['shares']):.1%} of prompt tokens, recompute "
            f"{b['shares']['recomputed']:.1%} -> {c['shares']['recomputed']:.1%}; TTFT p50 "
            f"{_ms(b['ttft_s']['p50'])} -> {_ms(c['ttft_s']['p50'])} "
            f"({_delta(b['ttft_s']['p50'], c['ttft_s']['p50'])}), p99 {_ms(b['ttft_s']['p99'])} -> "
            f"{_ms(c['ttft_s']['p99'])} ({_delta(b['ttft_s']['p99'], c['ttft_s']['p99'])})"]


def _expected(rec: Recommendation, promise=()) -> list[str]:
    """The promised TTFT change against the GPU tier alone, and (``promise``: rows of
    ``kvtier.demo.prediction.promise_vs_measured``) the change the engine measured on the same
    later requests, inside its interval or not."""
    by = {c.metric: c for c in rec.evidence.expected_vs_gpu_only}
    card = rec.evidence.latency_model
    if "ttft_p50_s" not in by:
        return [f"no TTFT change is promised: {card.why}"] if card is not None else []
    measured = {row.metric: row for row in promise}
    parts = []
    for name, metric in (("p50", "ttft_p50_s"), ("p99", "ttft_p99_s")):
        c = by.get(metric)
        if c is None:
            continue
        text = f"{name} {c.change * 1e3:+.1f} ms [{c.low * 1e3:+.1f}, {c.high * 1e3:+.1f}]"
        row = measured.get(metric)
        if row is not None:
            text += (f", measured {row.change[3] * 1e3:+.1f} ms "
                     f"({'inside' if row.inside()[2] else 'OUTSIDE'})")
        parts.append(text)
    model = f"the {card.model} model" if card is not None and card.model else "the cost model"
    return [f"expected on the later requests against the GPU tier alone ({model}, period "
            f"percentiles, 5th-95th percentile interval): TTFT {'; '.join(parts)}"]


def promise_lines(rows) -> list[str]:
    """The recommendation's promise against the engine, per TTFT percentile (``PromiseRow``)."""
    lines = [f"{'':10s} {'GPU only: promised [interval] / measured':>44s}  "
             f"{'+CPU tier: promised [interval] / measured':>44s}  {'change: promised [interval] / measured':>44s}"]
    for row in rows:
        cells = []
        for (p, lo, hi, m), ok in zip((row.baseline, row.candidate, row.change), row.inside()):
            cells.append(f"{p * 1e3:.1f} [{lo * 1e3:.1f}, {hi * 1e3:.1f}] / {m * 1e3:.1f} "
                         f"{'inside' if ok else 'OUTSIDE'}")
        ratios = ", ".join(f"{r:.2f}" for r in row.ratios())
        lines.append(f"{row.metric.removesuffix('_s'):10s} " + "  ".join(f"{c:>44s}" for c in cells)
                     + f"  (levels predicted/measured {ratios})")
    return lines


def _delta(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "-"
    return f"{(after - before) * 1e3:+.1f} ms"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f} ms"


def prediction_lines(predictions) -> list[str]:
    """Per deployed tier configuration (``kvtier.demo.prediction.TtftPrediction``): TTFT
    p50/p95/p99 predicted with its interval, measured, their ratio, and whether the
    measurement fell inside the interval."""
    lines = [f"{'phase':22s} {'reqs':>5s}  " + "  ".join(
        f"{'TTFT ' + q + ' predicted [interval] / measured (ratio)':>52s}" for q in ("p50", "p95", "p99"))]
    for p in predictions:
        cells = [f"{_ms(pr)} [{lo * 1e3:.1f}, {hi * 1e3:.1f}] / {_ms(me)} ({r:.2f}, "
                 f"{'inside' if ok else 'outside'})"
                 for pr, lo, hi, me, r, ok in zip(p.predicted_s, p.low_s, p.high_s, p.measured_s,
                                                  p.ratios(), p.inside())]
        lines.append(f"{p.tier_config_id:22s} {p.requests:5d}  " + "  ".join(f"{c:>52s}" for c in cells))
    return lines
