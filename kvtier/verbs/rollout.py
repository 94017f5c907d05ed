"""`kvtier rollout`: the controlled rollout: GPU-only, +CPU tier, +cold tier, with the rollback rule"""

from kvtier.verbs import not_yet

SUMMARY = "the controlled rollout: GPU-only, +CPU tier, +cold tier, with the rollback rule"
EXAMPLE = "kvtier rollout --endpoint http://127.0.0.1:8000 --trace conversation_trace.jsonl"


def add_arguments(parser) -> None:
    parser.add_argument("--endpoint", help="OpenAI-compatible base URL of the engine")
    parser.add_argument("--trace", help="trace that drives the load")


def run(args) -> int:
    raise not_yet("rollout", 6, "the rollout sequence")
