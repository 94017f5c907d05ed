"""`kvtier evaluate`: replay a trace's later part under each CPU-tier policy, learned included"""

SUMMARY = ("compare CPU-tier policies (LRU, ARC, S3-FIFO, learned admission and retention, "
           "Belady) on later time")
EXAMPLE = ("kvtier evaluate --trace conversation_trace.jsonl --gpu-tokens 1M --cpu-tokens 2.5M "
           "--policies lru,arc,s3fifo,learned,belady --json")


def add_arguments(parser) -> None:
    from policy.commands.arguments import add_trace_arguments

    parser.add_argument("--trace", help="trace to evaluate (Mooncake, WEKA, Bailian, store)")
    parser.add_argument("--train-trace", help="train on this trace and evaluate all of --trace")
    parser.add_argument("--train-fraction", type=float, default=0.5,
                        help="without --train-trace: train on this earliest share of the time "
                             "span, evaluate on the rest (default 0.5)")
    parser.add_argument("--split", choices=("time", "requests"), default="time",
                        help="what --train-fraction is a share of: the time span (default) or "
                             "the requests in arrival order (for traces with a long thin tail)")
    parser.add_argument("--gpu-tokens", help="GPU tier capacity (tokens, 1M, 16GiB with --model)")
    parser.add_argument("--cpu-tokens", help="CPU tier capacity")
    parser.add_argument("--cold-tokens", help="cold (file) tier capacity (default: none)")
    parser.add_argument("--policies", default="lru,arc,s3fifo,learned,belady",
                        help="comma-separated: lru, arc, s3fifo, belady, learned, learned-logistic, "
                             "learned-retention (the model's score, decayed by time since use, "
                             "orders CPU eviction), "
                             "oracle-reused (a diagnostic: admits blocks the trace references "
                             "again, knowing whether but not when)")
    parser.add_argument("--libcachesim", default="",
                        help="also run libCacheSim's policies as one cache of GPU+CPU size on "
                             "the same block stream, comma-separated: lcs:lru, lcs:s3fifo, "
                             "lcs:wtinylfu, lcs:glcache, lcs:lrb, lcs:lru+bloom, or 'all' "
                             "(needs the libcachesim package)")
    parser.add_argument("--seed", type=int, default=0, help="model seed (default 0)")
    parser.add_argument("--max-requests", type=int,
                        help="use only the first N requests of each trace (faster)")
    parser.add_argument("--coarsen", type=int, default=1,
                        help="merge K consecutive prefix blocks into one (exact prefix identity; "
                             "faster on 64-token WEKA blocks)")
    parser.add_argument("--prefill-servers", default="auto",
                        help="prefill servers sharing the queue in the TTFT estimate: a number, "
                             "or auto (default): the fewest that keep 80%% utilisation with "
                             "every prompt recomputed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_trace_arguments(parser)


def run(args) -> int:
    from policy.learn.command import run as evaluate

    return evaluate(args)
