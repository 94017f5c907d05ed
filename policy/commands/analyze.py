"""``kvtier analyze``: the reuse report of a trace or a store."""

from __future__ import annotations

import json
from pathlib import Path

from kvtier.errors import KvtierError
from policy.commands.common import (
    capacity_blocks,
    model_geometry,
    open_records,
    peek_block_tokens,
    print_json,
)
from policy.cost import CostParams


def run(args) -> int:
    if args.store and args.trace:
        raise KvtierError("give --trace or --store, not both")
    if args.store:
        args.trace, args.format = args.store, "store"
    reader, records = open_records(args)
    block_tokens, records = peek_block_tokens(records)
    model = model_geometry(args.model)
    gpu_blocks = capacity_blocks(args.gpu_tokens, block_tokens, model, "--gpu-tokens", None)
    report = _report(records, block_tokens, model, gpu_blocks, args)
    report["trace"]["skipped_lines"] = getattr(reader, "skipped", 0)
    if args.out:
        _write(Path(args.out), report)
    if args.json:
        print_json(report)
    else:
        from policy.reuse import render

        print(render(report))
    return 0


def _report(records, block_tokens: int, model, gpu_blocks, args) -> dict:
    from policy.curves import lru_curve_of
    from policy.reuse import report_from_stats
    from policy.reuse.collect_fast import collect_with_trace

    if args.drop_below is not None and not 0 <= args.drop_below <= 1:
        raise KvtierError(f"--drop-below must be in [0, 1], got {args.drop_below}")
    stats, trace = collect_with_trace(records, block_tokens)
    gpu_ratio = None
    if args.gpu_tokens is not None:  # the GPU-only LRU ratio, from the one-pass curve
        gpu_ratio = lru_curve_of(trace).token_hit_ratio(gpu_blocks)
    return report_from_stats(stats, CostParams(model=model), gpu_token_hit_ratio=gpu_ratio,
                             ttft_slo_s=args.ttft_slo_s, top=args.top,
                             drop_below=args.drop_below if args.drop_below is not None else 0.05)


def _write(folder: Path, report: dict) -> None:
    from policy.reuse import render

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reuse_report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "reuse_report.txt").write_text(render(report) + "\n")
