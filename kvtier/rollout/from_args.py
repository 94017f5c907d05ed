"""Glue for ``kvtier rollout`` (and the demo): arguments -> plan, switcher, load -> report."""

from __future__ import annotations

import itertools
from pathlib import Path

from kvtier.collector import json_text
from kvtier.errors import KvtierError


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise KvtierError(f"bad --concurrency {text!r}; use e.g. 1,2,4") from None
    if not levels or min(levels) < 1:
        raise KvtierError(f"bad --concurrency {text!r}; levels must be >= 1")
    return levels


def _check(args) -> None:
    """The flags, named as flags, before any work."""
    from kvtier.verbs.checks import output_file, positive

    for flag, value in (("--ttft-p99-budget-s", args.ttft_p99_budget_s),
                        ("--itl-p99-budget-s", args.itl_p99_budget_s),
                        ("--sustained-s", args.sustained_s), ("--window-s", args.window_s)):
        positive(value, flag)
    for flag, value, least in (("--requests", args.requests, 1), ("--gpu-blocks", args.gpu_blocks, 1),
                               ("--cpu-blocks", args.cpu_blocks, 0), ("--cold-blocks", args.cold_blocks, 0),
                               ("--max-tokens", args.max_tokens, 1), ("--block-tokens", args.block_tokens, 1),
                               ("--max-blocks", args.max_blocks, 1), ("--offset", args.offset, 0)):
        if value < least:
            raise KvtierError(f"{flag} must be >= {least}, got {value}")
    if args.trace:
        from kvtier.verbs.checks import input_path

        input_path(args.trace, "--trace")
    if args.store:
        output_file(args.store, "--store")
    if getattr(args, "operator", False):
        output_file(args.config_out, "--config-out")


def run_from_args(args, progress):
    from kvtier.policy.rollback.rule import LatencyBudget
    from kvtier.traces import bundled_trace
    from kvtier.policy.readers import open_trace
    from kvtier.rollout.drive import phase_driver
    from kvtier.rollout.plan import RolloutPlan
    from kvtier.rollout.runner import EngineAdminSwitcher, OperatorSwitcher, run_rollout
    from kvtier.probes.active.load import LoadConfig
    from kvtier.load import check_server, store_result

    _check(args)
    budget = LatencyBudget(args.ttft_p99_budget_s, args.itl_p99_budget_s, args.sustained_s, args.window_s)
    plan = RolloutPlan(args.gpu_blocks, args.cpu_blocks, args.cold_blocks, args.min_cold_gain, budget,
                       _cold_cost(getattr(args, "fs_json", None), args.block_tokens))
    load = LoadConfig(concurrency=parse_levels(args.concurrency), requests_per_level=args.requests,
                      max_tokens=args.max_tokens, block_tokens=args.block_tokens, max_blocks=args.max_blocks)
    total = args.requests * len(load.concurrency)
    trace = list(itertools.islice(open_trace(Path(args.trace) if args.trace else bundled_trace()).requests(),
                                  args.offset, args.offset + total))
    if not trace:
        raise KvtierError("the trace slice is empty; lower --offset")
    check_server(args.endpoint, "--endpoint")  # after the inputs: their errors come first
    store = (lambda tiers, result: store_result(result, args.store, args.endpoint)) if args.store else None
    run_phase = phase_driver(args.endpoint, trace, load, progress=progress,
                             **({"on_result": store} if store else {}))
    if args.operator:
        switcher = OperatorSwitcher(lambda tiers: _write_tiers(args.config_out, tiers), _wait_for_operator)
    else:
        switcher = EngineAdminSwitcher(args.endpoint)
    return run_rollout(plan, switcher, run_phase, block_tokens=args.block_tokens, progress=progress)


def _cold_cost(fs_json: str | None, block_tokens: int):
    """The measured cold-promotion cost from a file-tier probe's JSON, or ``None``."""
    if not fs_json:
        return None
    from kvtier.policy.recommend.cold_tier import cost_from_params
    from kvtier.policy.cost import measured_cost_params

    try:
        return cost_from_params(measured_cost_params(fs_json), block_tokens)
    except (OSError, ValueError) as error:
        raise KvtierError(f"--fs-json {fs_json}: {error}") from None


def _write_tiers(path: str, tiers) -> str:
    json_text.write(path, tiers.to_dict())
    return path


def _wait_for_operator(message: str) -> None:
    import sys

    print(f"kvtier rollout: {message} (press Enter)", file=sys.stderr, flush=True)
    if not sys.stdin.readline():
        raise KvtierError("no operator confirmation (standard input closed); stopping the rollout")


def render_table(report) -> str:
    """The per-phase comparison as a plain table."""
    lines = [f"{'phase':14s} {'reqs':>5s} {'GPU hit':>8s} {'CPU prom':>9s} {'cold prom':>10s} {'recompute':>10s} "
             f"{'TTFT p50':>9s} {'p95':>8s} {'p99':>8s} {'ITL p99':>8s}  action"]
    for phase in report.phases:
        s, ttft, itl = phase.summary["shares"], phase.summary["ttft_s"], phase.summary["itl_s"]
        lines.append(f"{phase.tiers.config_id:14s} {len(phase.records):5d} {s['gpu_hit']:8.1%} "
                     f"{s['cpu_promotion']:9.1%} {s['cold_promotion']:10.1%} {s['recomputed']:10.1%} "
                     f"{_ms(ttft, 'p50'):>9s} {_ms(ttft, 'p95'):>8s} {_ms(ttft, 'p99'):>8s} {_ms(itl, 'p99'):>8s}  "
                     f"{phase.action}")
    for config_id, reason in report.skipped:
        lines.append(f"{config_id:14s} skipped: {reason}")
    return "\n".join(lines)


def _ms(values: dict, key: str) -> str:
    value = values.get(key)
    return "-" if value is None else f"{value * 1000:.1f}ms"
