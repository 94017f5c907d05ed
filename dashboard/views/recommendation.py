"""Recommendation: what to set and why, leading with the settings and the TTFT change against
the GPU tier alone (absolute, with its interval); then each tier's size on its curve, the
relative change of token counts, host memory and the cold tier, the rollback rule and its
status, and the generated engine configs ready to copy. Read through policy's typed values."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from kvtier.collector import json_text
from kvtier.dashboard import charts, rollouts
from kvtier.dashboard.ready_configs import RENDERED_INTO, ready_configs
from kvtier.dashboard.recommended import formatted, latency_delta, setting_value
from kvtier.dashboard.artifacts import RECOMMENDATION_FILE, RecommendationFolder, load_recommendation
from kvtier.dashboard.views.base import PageContext, chart
from kvtier.policy.recommend.recommendation import Recommendation

MIB = 1 << 20
TOKEN_METRICS = ("gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens",
                 "recompute_tokens")


def render(ctx: PageContext) -> None:
    folder = ctx.config.recommendation
    try:
        loaded = load_recommendation(folder)
    except ValueError as error:
        st.error(str(error))
        return
    if loaded is None:
        st.info(
            f"No recommendation under `{folder}` yet.\n\n"
            f"`kvtier recommend --store STORE --engine all --out {folder}` (or `--trace TRACE`) "
            "sizes the tiers from the curve, trains the admission model and writes "
            "`recommendation.json` with the engine configs; `kvtier demo` writes one too.")
        return
    if loaded.rec is None:
        st.warning(f"`{RECOMMENDATION_FILE}` is not in `kvtier recommend`'s format "
                   f"({loaded.problem}); it is shown as it is.")
        st.code(json_text.dumps(loaded.doc, indent=2), language="json")
        _configs(loaded)
        return
    rec = loaded.rec
    _verdict(rec)
    _settings(rec)
    _inputs(rec)
    _ttft(rec)
    _promises(loaded.check)
    _calibration(loaded.calibration)
    _sizes(rec)
    _tokens(rec)
    _host_and_cold(rec)
    _rollback(ctx, rec)
    _configs(loaded)


def _verdict(rec: Recommendation) -> None:
    text = f"**Verdict: {rec.verdict.words}**"
    if rec.verdict.note:
        text += f"\n\n_{rec.verdict.note}_"
    text += "\n\n" + "\n".join(f"- {r.sentence}" for r in rec.verdict.reasons)
    (st.success if rec.verdict.outcome == "offload" else st.warning)(text)


def _settings(rec: Recommendation) -> None:
    st.subheader("What to set")
    rows = [{"setting": k.name, "value": setting_value(rec, k.name, k.value), "why": k.why}
            for k in rec.knobs]
    st.table(pd.DataFrame(rows).set_index("setting"))  # a static table: the reasons wrap
    if any(row["value"] != formatted(k.name, k.value) for row, k in zip(rows, rec.knobs)):
        st.caption("Where engines receive different values, each is named: the value is what "
                   "its config file carries (Engine configs, below).")


def _inputs(rec: Recommendation) -> None:
    """What the figures rest on that nobody measured, and a model too weak to use."""
    model = rec.evidence.model
    if model is not None and model.weak:
        st.warning(f"Model flagged: {model.weak}; its scores set no threshold.")
    defaults = rec.evidence.defaults()
    if defaults:
        st.caption("Documented defaults, not measured: " + ", ".join(
            f"{i.name} = {i.value:,.6g}" for i in defaults)
            + " (kvtier calibrate --out FILE, then recommend --cost-params FILE).")
    counted = [i for i in rec.evidence.inputs if i.observations is not None]
    if counted:
        st.caption("Costs the latency model rests on: " + "; ".join(
            f"{i.name} {i.value:.3g} ({i.source}, {i.observations:,} {i.note})" for i in counted))


def _ttft(rec: Recommendation) -> None:
    changes = {c.metric: c for c in rec.evidence.expected_vs_gpu_only}
    card = rec.evidence.latency_model
    st.subheader("Time to first token against the GPU tier alone")
    if card is not None and card.flag:
        st.warning(f"Flagged: {card.flag}; it makes no promise.")
    if "ttft_p50_s" not in changes:
        st.info(f"No TTFT is promised: {card.why}." if card is not None and card.why
                else "This recommendation holds no TTFT prediction.")
        return
    model = f"the {card.model} model ({card.why})" if card is not None else "the cost model"
    st.caption(f"Replayed on the later, held-out part of the requests by {model}: each "
               "percentile over those requests, as the engine measures it; interval: 5th-95th "
               "percentile over noise draws and resampled requests, the change paired on the "
               "same requests.")
    rows = []
    for column, quantile in zip(st.columns(3), ("p50", "p95", "p99")):
        c = changes.get(f"ttft_{quantile}_s")
        if c is None:
            continue
        style = latency_delta(c)  # the arrow follows the change; lower latency is better
        column.metric(f"TTFT {quantile} change", f"{c.change * 1e3:+.1f} ms",
                      f"[{c.low * 1e3:+.1f}, {c.high * 1e3:+.1f}] ms; {c.baseline * 1e3:.1f} -> "
                      f"{c.candidate * 1e3:.1f} ms", delta_color=style.colour,
                      delta_arrow=style.arrow)
        rows.append({"quantile": quantile, "change_ms": c.change * 1e3, "low_ms": c.low * 1e3,
                     "high_ms": c.high * 1e3})
    chart(pd.DataFrame(rows), charts.ttft_change())


def _promises(check: dict | None) -> None:
    """What ``kvtier recommend --check`` last said: each prediction against the measurement
    on the requests under the pushed tier configuration."""
    if check is None:
        return
    st.subheader("Did it hold?")
    held = check.get("held")
    words = (f"{check.get('requests')} requests under `{check.get('tier_config')}`; predicted "
             f"for {check.get('basis')}")
    if held is None:
        st.info(f"Not judged yet: {words}; {check.get('more_needed')} more needed.")
    else:
        (st.success if held else st.error)(
            f"{'Every prediction held' if held else 'A prediction did not hold'}: {words}.")
    st.table(pd.DataFrame([{"metric": p.get("metric"), "predicted": p.get("predicted"),
                            "low": p.get("low"), "high": p.get("high"),
                            "measured": p.get("measured"),
                            "held": {True: "held", False: "outside", None: ""}.get(p.get("held"), "")}
                           for p in check["promises"]]).set_index("metric"))
    watched = check.get("watched_s")
    if isinstance(watched, (int, float)):
        import time

        st.caption(f"Watched live: the collector (`kvtier collect --recommendation`) runs this "
                   f"check on its store at every refresh; last at "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(watched))}. The first "
                   "share of requests, which warms the new tiers, is left out as in the prediction.")
        return
    st.caption("kvtier recommend --check RECOMMENDATION --store STORE writes this; the first "
               "share of requests, which warms the new tiers, is left out as in the prediction.")


def _calibration(held: dict | None) -> None:
    """``kvtier calibrate``'s check of the engine model behind the TTFT prediction: fitted on
    the earlier requests of the store, replayed on the later ones per tier configuration."""
    if held is None:
        return
    st.subheader("How well the latency model predicts this engine")
    rows = [{"tier configuration": c.get("tier_config_id") or "(none)", "requests": c.get("requests"),
             "metric": name, "predicted (ms)": _ms(c.get("predicted", {}).get(name)),
             "measured (ms)": _ms(c.get("measured", {}).get(name)),
             "predicted / measured": c.get("ratio", {}).get(name)}
            for c in held["by_tier_config"] for name in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
                                                         "itl_p50_s", "itl_p99_s")]
    st.table(pd.DataFrame(rows).set_index(["tier configuration", "metric"]))
    st.caption("kvtier calibrate STORE --out FILE fits the engine model on the earlier requests "
               "and replays the later ones; recommend --cost-params FILE carries this check.")


def _ms(seconds) -> float | None:
    return None if seconds is None else seconds * 1e3


def _sizes(rec: Recommendation) -> None:
    for size in rec.evidence.sizes:
        st.subheader(f"{size.tier.upper()} tier size from the curve")
        st.write(f"{size.reason}. The next GiB at this size frees "
                 f"{size.gain_per_gib_at_chosen:.3%} of a prefill server's time "
                 f"(threshold {size.threshold_per_gib:.2%}).")
        ratios = [p.token_hit_ratio for p in size.curve]
        if ratios and max(ratios) - min(ratios) > 1e-3:  # a flat curve says nothing more
            top = max(p.capacity_bytes for p in size.curve)
            unit, scale = ("GiB", 2 ** 30) if top >= 4 * 2 ** 30 else ("MiB", MIB)
            frame = pd.DataFrame([{"capacity": p.capacity_bytes / scale,
                                   "token_hit_ratio": p.token_hit_ratio,
                                   "gain_per_gib": p.gain_per_gib,
                                   "chosen": p.capacity_bytes == size.chosen_bytes}
                                  for p in size.curve])
            chart(frame, charts.tier_curve(size.tier, unit))


def _tokens(rec: Recommendation) -> None:
    rows = [{"metric": c.metric, "baseline": c.baseline, "candidate": c.candidate,
             **{f"{k}_share": getattr(c, k) / abs(c.baseline) for k in ("change", "low", "high")}}
            for c in rec.evidence.expected_vs_gpu_only
            if c.metric in TOKEN_METRICS and c.baseline]
    if not rows:
        return
    st.subheader("Prompt tokens per outcome, relative to the GPU tier alone")
    chart(pd.DataFrame(rows), charts.expected_changes())


def _host_and_cold(rec: Recommendation) -> None:
    """Whether the CPU size was checked against host memory (and what a cap cost), and the
    vLLM file-tier decision with its measured or assumed costs."""
    host, cold = rec.evidence.host_memory, rec.evidence.vllm_file_tier
    st.subheader("Host memory and the cold tier")
    gib = 2 ** 30
    if not host.checked:
        st.warning("The CPU tier size was **not checked against host memory**: run "
                   "`kvtier probe headroom --json` and pass it to `kvtier recommend "
                   "--headroom-json`.")
    else:
        text = (f"Host headroom {host.headroom_bytes / gib:.1f} GiB less a "
                f"{host.safety_margin_bytes / gib:.1f} GiB margin: the CPU tier may take "
                f"{host.cap_bytes / gib:.1f} GiB ({host.source}).")
        if host.capped:
            text += (f" The {host.requested_cpu_bytes / gib:.1f} GiB the curve asked for was "
                     f"capped to {host.recommended_cpu_bytes / gib:.1f} GiB")
            if host.token_hit_ratio_lru_at_requested is not None:
                text += (f"; LRU token hit ratio {host.token_hit_ratio_lru_at_requested:.1%} at "
                         f"the asked size, {host.token_hit_ratio_lru_at_cap:.1%} at the cap")
            text += "."
        st.info(text)
    if cold is not None:
        (st.success if cold.add else st.warning)(f"vLLM file tier: {cold.reason}")


def _rollback(ctx: PageContext, rec: Recommendation) -> None:
    st.subheader("Rollback rule")
    rule = rec.evidence.rollback
    if rule is None:
        st.info("The recommendation names no rollback budgets (`kvtier recommend --ttft-slo-s`, "
                "`--itl-slo-s`), so there is no rule to check yet.")
        return
    itl = "" if rule.itl_p99_s is None else f" or the p99 ITL over {rule.itl_p99_s * 1e3:.1f} ms"
    st.write(f"Deploy with it: disable the newest tier when the p99 TTFT stays over "
             f"{rule.ttft_p99_s * 1e3:.1f} ms{itl} for {rule.sustained_s} s "
             f"(p99 over {rule.window_s} s windows).")
    _budget_status(ctx, rule)


def _budget_status(ctx: PageContext, rule) -> None:
    """Each act's newest configuration against its own budget: a demo's second act is not
    held to the first act's recommendation."""
    latency = ctx.query("request_latency")
    p99 = latency[latency["quantile"] == "p99"]
    if p99.empty:
        st.info("No TTFT/ITL measurements to check the rule against.")
        return
    try:
        recorded = rollouts.load_rollouts(ctx.config.rollouts)
    except ValueError as error:
        st.error(str(error))
        recorded = ()
    configs = list(ctx.facets.tier_configs)
    budgets = rollouts.act_budgets(configs, rule, recorded)
    checks = rollouts.budget_checks(p99, configs, budgets)
    for act, budget in budgets.items():
        mine = [c for c in checks if c.act == act]
        for check in mine:
            whose = ("this recommendation's rule" if budget.source == "recommendation"
                     else "the budget its own rollout held it to")
            if budget.baseline:
                whose += f", set by `{budget.baseline}`"
            status = "over budget: roll back the newest tier" if check.over else "within budget"
            st.write(f"{f'act `{act}`: ' if act else ''}`{check.tier_config}` {check.metric.upper()} p99 "
                     f"{check.value_ms:.1f} ms against {check.budget_ms:.1f} ms ({whose}): **{status}**")
        if mine and budget.decided:
            st.caption(f"The rollout decided on `{mine[0].tier_config}`: {budget.decided} (its rule "
                       "watches p99 over windows, held for a while; above is the whole phase's p99).")
    unbudgeted = [act for act, budget in budgets.items() if budget is None]
    if unbudgeted:
        st.caption("No budget recorded for " + ", ".join(f"`{a or '(unnamed)'}`" for a in unbudgeted)
                   + ": the recommendation's rule was set on another act's baseline, and no "
                   "rollout record names one.")


def _configs(loaded: RecommendationFolder) -> None:
    """Each engine's config as kvtier push writes it (vLLM's with kvtier's recording connector),
    then the folder's other files (a gateway's retention configs), each as it is."""
    rendered = ready_configs(loaded.rec) if loaded.rec is not None else ()
    shown = {c.name for c in rendered}
    others = [c for c in loaded.configs if c[0] not in shown]
    if rendered or others:
        st.subheader("Engine configs, ready to copy")
        st.caption("Apply one with `kvtier push` (it checks guardrails, shows the diff and keeps "
                   "a backup); each is what push writes for that engine.")
    for note in loaded.doc.get("notes", []):
        st.caption(str(note))
    for config in rendered:
        st.markdown(f"**{config.name}**")
        if config.engine in RENDERED_INTO:
            st.caption("As `kvtier push --engine vllm` writes it into a config that loads kvtier's "
                       "recording connector and spec (kvtier installed in vLLM's environment; "
                       "push keeps the connector a file loads): copied as it is, the engine goes "
                       "on recording. Under vLLM's own OffloadingConnector the same tiers serve "
                       "and no request is recorded.")
        st.code(config.text, language=config.language)
    for name, language, text in others:
        st.markdown(f"**{name}**")
        st.code(text, language=language)
    if loaded.plots or loaded.report:
        with st.expander("Full report"):
            if loaded.report:
                st.markdown(loaded.report)
            for plot in loaded.plots:
                st.image(str(plot), caption=plot.name)
