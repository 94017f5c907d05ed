"""`kvtier simulate`: what-if replay of a trace against tier sizes and cache policies"""

from kvtier.verbs import not_yet

SUMMARY = "what-if replay of a trace against tier sizes and cache policies"
EXAMPLE = "kvtier simulate --trace conversation_trace.jsonl --gpu-tokens 200000 --cpu-tokens 2000000 --policy lru --json"


def add_arguments(parser) -> None:
    parser.add_argument("--trace", help="trace file or folder")
    parser.add_argument("--gpu-tokens", type=int, help="GPU tier capacity in tokens")
    parser.add_argument("--cpu-tokens", type=int, help="CPU tier capacity in tokens")
    parser.add_argument("--cold-tokens", type=int, help="cold tier capacity in tokens")
    parser.add_argument("--policy", default="lru", help="cache policy")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    raise not_yet("simulate", 3, "the tiered what-if simulator")
