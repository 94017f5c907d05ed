"""The reuse report for people: short sections, one line per fact."""

from __future__ import annotations


def render(report: dict) -> str:
    """Plain text of a report from :func:`kvtier.policy.reuse.report_from_stats`."""
    lines: list[str] = []
    trace = report["trace"]
    lines.append(f"trace: {trace['requests']:,} requests, {trace['prompt_tokens']:,} prompt tokens, "
                 f"{trace['block_refs']:,} block references over {trace['duration_s']:.0f} s "
                 f"({trace['block_tokens']}-token blocks)")
    shared = report["shared_prefixes"]
    lines += ["", "1. Which prefixes are shared",
              f"   an unlimited cache serves {shared['ideal_token_hit_ratio']:.1%} of prompt tokens",
              f"   {shared['blocks_used_once_fraction']:.1%} of {shared['distinct_blocks']:,} "
              f"distinct blocks are used once"]
    for row in shared["top"][:5]:
        lines.append(f"   prefix of {row['prefix_tokens']:,} tokens used {row['uses']:,} times "
                     f"saves {row['saved_tokens']:,} tokens")
    timing = report["reuse_timing"]
    lines += ["", "2. How long after creation they are reused",
              _quantiles("since creation", timing["since_creation"]),
              _quantiles("since last use", timing["since_last_use"]),
              "   reused within " + ", ".join(f"{k}: {v:.0%}" for k, v in timing["reused_within"].items())]
    for kind, row in timing["by_type"].items():
        lines.append(_quantiles(f"[{kind}] since last use", row["since_last_use"]))
    for bucket, row in timing["since_last_use_by_turn"].items():
        lines.append(_quantiles(f"[turn {bucket}] since last use", row))
    sizing = report["block_sizing"]
    source = sizing.get("geometry_source", "default")
    lines += ["", "3. How big a useful block is against the transfer budget",
              f"   {_bytes(sizing['bytes_per_block'])} per {sizing['block_tokens']}-token block, "
              f"{sizing.get('bytes_per_token', 0):,} bytes per token ({source}: {sizing['model']})"]
    if source == "default":
        lines.append(f"   (KV geometry is the default model's, not measured: give --model or "
                     "--kv-bytes-per-token, or a store an engine probe wrote)")
    for path, row in sizing["paths"].items():
        even = row["break_even_block_tokens"]
        lines.append(f"   {path}->GPU: move {row['transfer_s_per_block'] * 1e3:.2f} ms vs recompute "
                     f"{row['recompute_s_per_block'] * 1e3:.2f} ms per block; break-even "
                     + (f"{even:.1f} tokens" if even is not None else "never"))
    if sizing["host_link_load"] is not None:
        lines.append(f"   promoting every reuse from CPU would load the host link to "
                     f"{sizing['host_link_load']:.1%}")
    defaults = sorted(k for k, v in sizing["parameter_sources"].items() if v == "default")
    if defaults:
        lines.append(f"   (documented defaults, not measured: {', '.join(defaults)})")
    drop = report["drop"]
    lines += ["", "4. Which blocks to drop at once"]
    for row in drop["by_depth"]:
        lines.append(f"   depth {row['bucket']:>7}: {row['reuse_probability']:.1%} of "
                     f"{row['blocks']:,} blocks reused")
    if drop["drop_depths"]:
        lines.append(f"   drop (reuse < {drop['drop_below']:.0%}): depths {', '.join(drop['drop_depths'])}")
    offload = report["offloading"]
    lines += ["", f"Offloading verdict: {offload['verdict'].replace('_', ' ')}"]
    for reason in offload["reasons"]:
        mark = {True: "yes", False: "no", None: "?"}[reason["holds"]]
        lines.append(f"   [{mark:>3}] {reason['reason']}: {reason['evidence']}")
    return "\n".join(lines)


def _bytes(size: int) -> str:
    return f"{size / 2**20:.2f} MiB" if size >= 2**20 else f"{size / 2**10:.2f} KiB"


def _quantiles(label: str, summary: dict) -> str:
    if not summary["count"]:
        return f"   {label}: no reuses"
    return (f"   {label}: p50 {_s(summary['p50_s'])}, p90 {_s(summary['p90_s'])}, "
            f"p99 {_s(summary['p99_s'])} ({summary['count']:,} reuses)")


def _s(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds / 60:.1f} min"
