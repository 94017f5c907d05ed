"""`kvtier analyze`: the reuse report: shared prefixes, reuse times, move-vs-recompute cost, blocks to drop"""

SUMMARY = "the reuse report: shared prefixes, reuse times, move-vs-recompute cost, blocks to drop"
EXAMPLE = "kvtier analyze --trace conversation_trace.jsonl --gpu-tokens 1M --ttft-slo-s 2 --out report/"


def add_arguments(parser) -> None:
    from policy.commands.arguments import add_trace_arguments

    parser.add_argument("--trace", help="trace file or folder (Mooncake, WEKA, Bailian, Parquet segments)")
    parser.add_argument("--store", help="a kvtier DuckDB store to analyse instead of a trace")
    parser.add_argument("--gpu-tokens", help="deployed GPU KV capacity, to test 'GPU memory is not the limit'")
    parser.add_argument("--ttft-slo-s", type=float, help="p99 TTFT budget in seconds")
    parser.add_argument("--top", type=int, default=10, help="shared prefixes to list (default 10)")
    parser.add_argument("--drop-below", type=float,
                        help="reuse probability under which blocks are dropped at once (default 0.05)")
    parser.add_argument("--out", help="folder for reuse_report.json and reuse_report.txt")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_trace_arguments(parser)


def run(args) -> int:
    from policy.commands.analyze import run as analyze

    return analyze(args)
