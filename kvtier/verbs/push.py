"""`kvtier push`: apply a recommendation to an engine config file, atomically, with a diff and guardrails"""

from kvtier.verbs import not_yet

SUMMARY = "apply a recommendation to an engine config file, atomically, with a diff and guardrails"
EXAMPLE = "kvtier push --recommendation reco/recommendation.json --engine vllm --config vllm.yaml"


def add_arguments(parser) -> None:
    parser.add_argument("--recommendation", help="recommendation.json written by kvtier recommend")
    parser.add_argument("--engine", help="vllm, trtllm, lmcache, sglang or dynamo")
    parser.add_argument("--config", help="the engine config file to update")
    parser.add_argument("--dry-run", action="store_true", help="show the diff, change nothing")


def run(args) -> int:
    raise not_yet("push", 4, "the engine config writers")
