"""`kvtier analyze`: the reuse report: shared prefixes, reuse times, move-vs-recompute cost, blocks to drop"""

from __future__ import annotations

from pathlib import Path
from kvtier.errors import KvtierError

SUMMARY = "the reuse report: shared prefixes, reuse times, move-vs-recompute cost, blocks to drop"
EXAMPLE = "kvtier analyze --trace conversation_trace.jsonl --gpu-tokens 1M --ttft-slo-s 2 --out report/"


def add_arguments(parser) -> None:
    from kvtier.verbs.trace_args import add_trace_arguments

    parser.add_argument("--trace", help="trace file or folder (Mooncake, WEKA, Bailian, Parquet segments)")
    parser.add_argument("--store", help="a kvtier DuckDB store to analyse instead of a trace")
    parser.add_argument("--gpu-tokens", help="deployed GPU KV capacity, to test 'GPU memory is not the limit'")
    parser.add_argument("--ttft-slo-s", type=float, help="p99 TTFT budget in seconds")
    parser.add_argument("--headroom-json", help="the output of `kvtier probe headroom --json`, "
                                                "to test 'host DRAM is contested'")
    parser.add_argument("--top", type=int, default=10, help="shared prefixes to list (default 10)")
    parser.add_argument("--drop-below", type=float,
                        help="reuse probability under which blocks are dropped at once (default 0.05)")
    parser.add_argument("--out", help="folder for reuse_report.json and reuse_report.txt")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_trace_arguments(parser)


def run(args) -> int:
    from kvtier.verbs.common import (capacity_blocks, capacity_model, kv_geometry, open_records,
                                     peek_block_tokens, print_json)

    from kvtier.verbs.checks import output_dir, positive

    if args.store and args.trace:
        raise KvtierError("give --trace or --store, not both")
    if args.out:
        output_dir(args.out, "--out")
    if args.top < 0:
        raise KvtierError(f"--top must be >= 0, got {args.top}")
    positive(args.ttft_slo_s, "--ttft-slo-s")
    if args.store:
        args.trace, args.format = args.store, "store"
    reader, records = open_records(args)
    block_tokens, records = peek_block_tokens(records)
    model = kv_geometry(args, reader, block_tokens)
    gpu_blocks = capacity_blocks(args.gpu_tokens, block_tokens, capacity_model(args, model),
                                 "--gpu-tokens", None)
    report = _report(records, block_tokens, model, gpu_blocks, args)
    report["trace"]["skipped_lines"] = getattr(reader, "skipped", 0)
    if args.out:
        _write(Path(args.out), report)
    if args.json:
        print_json(report)
    else:
        from kvtier.policy.reuse import render

        print(render(report))
    return 0


def _report(records, block_tokens: int, model, gpu_blocks, args) -> dict:
    from kvtier.policy.cost import CostParams

    from kvtier.policy.curves import lru_curve_of
    from kvtier.policy.reuse import report_from_stats
    from kvtier.policy.reuse.collect import collect_with_trace

    if args.drop_below is not None and not 0 <= args.drop_below <= 1:
        raise KvtierError(f"--drop-below must be in [0, 1], got {args.drop_below}")
    stats, trace = collect_with_trace(records, block_tokens)
    gpu_ratio = None
    if args.gpu_tokens is not None:  # the GPU-only LRU ratio, from the one-pass curve
        gpu_ratio = lru_curve_of(trace).token_hit_ratio(gpu_blocks)
    host_cap = None
    if args.headroom_json:
        from kvtier.policy.recommend.headroom import from_probe_json

        try:
            host_cap = from_probe_json(args.headroom_json).cap_bytes
        except ValueError as error:
            raise KvtierError(f"--headroom-json: {error}") from None
    return report_from_stats(stats, CostParams(model=model), gpu_token_hit_ratio=gpu_ratio,
                             ttft_slo_s=args.ttft_slo_s, host_cap_bytes=host_cap, top=args.top,
                             drop_below=args.drop_below if args.drop_below is not None else 0.05)


def _write(folder: Path, report: dict) -> None:
    from kvtier.collector import json_text
    from kvtier.policy.reuse import render

    folder.mkdir(parents=True, exist_ok=True)
    json_text.write(folder / "reuse_report.json", report)
    (folder / "reuse_report.txt").write_text(render(report) + "\n")
