"""`kvtier simulate`: what-if replay of a trace against tier sizes and cache policies"""

SUMMARY = "what-if replay of a trace against tier sizes and cache policies"
EXAMPLE = "kvtier simulate --trace conversation_trace.jsonl --gpu-tokens 200000 --cpu-tokens 2000000 --policy lru --json"

POLICIES = ("lru", "arc", "s3fifo", "priority", "belady", "vllm", "trtllm")


def add_arguments(parser) -> None:
    from policy.commands.arguments import add_trace_arguments

    parser.add_argument("--trace", help="trace file or folder (Mooncake, WEKA, Bailian, store)")
    parser.add_argument("--gpu-tokens", help="GPU tier capacity: 4e6, 10M, 16GiB (with --model) or inf")
    parser.add_argument("--cpu-tokens", help="CPU tier capacity (default: no CPU tier)")
    parser.add_argument("--cold-tokens", help="cold (file) tier capacity (default: none)")
    parser.add_argument("--policy", default="lru", choices=POLICIES,
                        help="eviction policy in every tier, or an engine's semantics (vllm, trtllm)")
    parser.add_argument("--cpu-policy", default="lru", choices=("lru", "arc"),
                        help="vllm: the CPU tier's eviction_policy")
    parser.add_argument("--store-threshold", type=int, default=0,
                        help="store a block in CPU only on its Nth offer (vLLM store_threshold)")
    parser.add_argument("--offload-min-priority", type=int, default=30,
                        help="trtllm: secondary_offload_min_priority (code default 30)")
    parser.add_argument("--offload-comparison", default="ge", choices=("ge", "gt"),
                        help="trtllm: 'ge' as coded (>=) or 'gt' as documented (>)")
    parser.add_argument("--default-priority", type=int, default=35,
                        help="trtllm/priority: retention priority of blocks (default 35)")
    parser.add_argument("--prefix-blocks", type=int, default=0,
                        help="trtllm/priority: the first N blocks of each prompt get --prefix-priority")
    parser.add_argument("--prefix-priority", type=int, default=35,
                        help="trtllm/priority: retention priority of those prefix blocks")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply arrival times (0.5 doubles the load) for the TTFT estimate")
    parser.add_argument("--prefill-servers", type=int, default=1,
                        help="prefill servers sharing the queue in the TTFT estimate (default 1)")
    parser.add_argument("--sweep", nargs="?", const="",
                        help="print a hit-ratio curve over GPU capacities (comma-separated; "
                             "default grid when empty); one pass for lru")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_trace_arguments(parser)


def run(args) -> int:
    from policy.commands.simulate import run as simulate

    return simulate(args)
