"""`kvtier recommend`: train the admission model, sweep thresholds, write a report and engine configs"""

SUMMARY = "train the admission model, sweep thresholds, write a report and engine configs"
EXAMPLE = ("kvtier recommend --trace conversation_trace.jsonl --gpu-tokens 1M --cpu-tokens 2.5M "
           "--engine all --out reco/")
ENGINE_CHOICES = ("vllm", "trtllm", "lmcache", "sglang", "dynamo", "all")


def add_arguments(parser) -> None:
    from policy.commands.arguments import add_trace_arguments

    parser.add_argument("--trace", help="trace file or folder")
    parser.add_argument("--store", help="a kvtier DuckDB store")
    parser.add_argument("--engine", default="all", choices=ENGINE_CHOICES,
                        help="vllm, trtllm, lmcache, sglang, dynamo or all")
    parser.add_argument("--out", default="kvtier-out/recommendation", help="output folder")
    parser.add_argument("--gpu-tokens", default="1M",
                        help="the deployed GPU prefix-cache capacity (default 1M tokens)")
    parser.add_argument("--cpu-tokens", default="2.5M",
                        help="the candidate CPU tier capacity (default 2.5M tokens)")
    parser.add_argument("--train-fraction", type=float, default=0.5,
                        help="train on this earliest share of time, measure on the rest")
    parser.add_argument("--seed", type=int, default=0, help="model and bootstrap seed")
    parser.add_argument("--prefill-servers", default="auto",
                        help="prefill servers sharing the queue in the TTFT estimate: a number, "
                             "or auto (default): the fewest that keep 80%% utilisation with "
                             "every prompt recomputed")
    host = parser.add_mutually_exclusive_group()
    host.add_argument("--host-headroom-bytes", type=int,
                      help="host DRAM the CPU tier may use; every recommended CPU size is capped "
                           "at it less a safety margin of max(10%%, 1 GiB), and push checks it")
    host.add_argument("--headroom-json",
                      help="the output of `kvtier probe headroom --json`: cap CPU sizes at its "
                           "safe_bytes (available less the probe's margin and reserve)")
    parser.add_argument("--cold-tokens", default="10M",
                        help="vLLM: the candidate file (cold) tier capacity (default 10M tokens; "
                             "0: do not consider one)")
    parser.add_argument("--cold-path", help="vLLM: the file tier's absolute directory (without "
                                            "it the file tier is decided but not written)")
    parser.add_argument("--fs-json",
                        help="the output of `kvtier probe fs --json`: the measured cold-promotion "
                             "cost, weighed against recompute before adding a file tier")
    parser.add_argument("--max-requests", type=int, help="use only the first N requests")
    parser.add_argument("--coarsen", type=int, default=1,
                        help="merge K consecutive prefix blocks into one (exact prefix identity)")
    add_trace_arguments(parser)


def run(args) -> int:
    from policy.recommend.command import run as recommend

    return recommend(args)
