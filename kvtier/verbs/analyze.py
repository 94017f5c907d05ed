"""`kvtier analyze`: the reuse report: shared prefixes, reuse times, move-vs-recompute cost, blocks to drop"""

from kvtier.verbs import not_yet

SUMMARY = "the reuse report: shared prefixes, reuse times, move-vs-recompute cost, blocks to drop"
EXAMPLE = "kvtier analyze --trace conversation_trace.jsonl --out report/"


def add_arguments(parser) -> None:
    parser.add_argument("--trace", help="trace file or folder (Mooncake, WEKA, Bailian, Parquet segments)")
    parser.add_argument("--store", help="a kvtier DuckDB store to analyse instead of a trace")
    parser.add_argument("--out", help="folder for the report")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    raise not_yet("analyze", 3, "reuse analysis over a trace or the store")
