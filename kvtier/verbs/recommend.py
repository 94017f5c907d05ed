"""`kvtier recommend`: train the admission model, sweep thresholds, write a report and engine configs"""

from kvtier.verbs import not_yet

SUMMARY = "train the admission model, sweep thresholds, write a report and engine configs"
EXAMPLE = "kvtier recommend --trace conversation_trace.jsonl --engine all --out reco/"


def add_arguments(parser) -> None:
    parser.add_argument("--trace", help="trace file or folder")
    parser.add_argument("--store", help="a kvtier DuckDB store")
    parser.add_argument("--engine", default="all", help="vllm, trtllm, lmcache, sglang, dynamo or all")
    parser.add_argument("--out", default="kvtier-out/recommendation", help="output folder")


def run(args) -> int:
    raise not_yet("recommend", 5, "the learned admission model and threshold sweep")
