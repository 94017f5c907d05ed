"""`kvtier recommend`: train the admission model, sweep thresholds, write a report and engine configs"""

from __future__ import annotations

from pathlib import Path
from kvtier.errors import KvtierError

SUMMARY = "train the admission model, sweep thresholds, write a report and engine configs"
EXAMPLE = ("kvtier recommend --trace conversation_trace.jsonl --gpu-tokens 1M --cpu-tokens 2.5M "
           "--engine all --out reco/")
ENGINE_CHOICES = ("vllm", "trtllm", "lmcache", "sglang", "dynamo", "all")


def add_arguments(parser) -> None:
    from kvtier.verbs.trace_args import add_trace_arguments

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


PHASES = 4


def run(args) -> int:
    from kvtier.progress import task
    from kvtier.verbs.common import capacity_blocks, model_geometry, open_records
    from policy.cost import CostParams, parse_servers
    from policy.learn.subset import limited
    from policy.recommend import report
    from policy.recommend.build import Inputs, recommend
    from policy.writers import ENGINES
    from policy.cost import measured_cost_params

    if bool(args.trace) == bool(args.store):
        raise KvtierError("give exactly one of --trace PATH or --store DB")
    args.trace = args.trace or args.store
    if args.store:
        args.format = "store"
    reader, records = open_records(args)
    records = list(limited(records, args.max_requests, args.coarsen))
    if len(records) < 40:
        raise KvtierError(f"{args.trace}: {len(records)} requests; a recommendation needs "
                          "at least 40 (half to train, half to measure)")
    model = model_geometry(args.model)
    block_tokens = records[0].block_size_tokens or 16
    gpu = capacity_blocks(args.gpu_tokens, block_tokens, model, "--gpu-tokens")
    cpu = capacity_blocks(args.cpu_tokens, block_tokens, model, "--cpu-tokens")
    if not gpu or not cpu:
        raise KvtierError("--gpu-tokens and --cpu-tokens must be finite and hold at least "
                          f"one {block_tokens}-token block")
    cold = capacity_blocks(args.cold_tokens, block_tokens, model, "--cold-tokens")
    if cold is None:
        raise KvtierError("--cold-tokens must be finite (0: do not consider a file tier)")
    try:
        params = CostParams(model=model)
        if args.fs_json:
            params = measured_cost_params(args.fs_json, base=params)
        inputs = Inputs(gpu, cpu, args.train_fraction, args.seed,
                        parse_servers(args.prefill_servers),
                        host=_host_limit(args), cold_blocks=cold, cold_path=args.cold_path,
                        cold_cost=_store_cold_cost(reader, block_tokens, params))
    except (OSError, ValueError) as error:
        raise KvtierError(str(error)) from None
    with task("recommending", total=PHASES) as advance:
        rec = recommend(records, inputs, params, step=lambda name: advance())
    engines = ENGINES if args.engine == "all" else (args.engine,)
    written = report.write(rec, Path(args.out), engines)
    print(f"verdict: {rec.verdict.words}")
    if rec.verdict.note:
        print(f"  ({rec.verdict.note})")
    for knob in rec.knobs:
        print(f"  {knob.name} = {knob.value}")
    print(f"wrote {len(written)} files to {args.out} (report.md, recommendation.json, configs)")
    return 0


def _host_limit(args) -> HostLimit | None:
    from policy.recommend.headroom import from_bytes, from_probe_json

    if getattr(args, "headroom_json", None):
        return from_probe_json(args.headroom_json)
    if getattr(args, "host_headroom_bytes", None) is not None:
        return from_bytes(args.host_headroom_bytes)
    return None


def _store_cold_cost(reader, block_tokens: int, params: CostParams) -> ColdCost | None:
    """Cold promotions and recomputes as the engine measured them, from a store's block
    events (median seconds per token); ``None`` for traces, or a store without them."""
    from policy.recommend.cold_tier import cost_from_latencies

    store = getattr(reader, "store", None)
    if store is None:
        return None
    rows = store.query("""
        SELECT CAST(kind AS VARCHAR) AS kind, median(latency_s / tokens) AS s_per_token
        FROM block_events
        WHERE latency_s IS NOT NULL AND tokens > 0
          AND CAST(kind AS VARCHAR) IN ('cold_promotion', 'recompute_miss')
        GROUP BY ALL""").to_pylist()
    measured = {row["kind"]: row["s_per_token"] for row in rows}
    return cost_from_latencies(block_tokens, measured.get("cold_promotion"),
                               measured.get("recompute_miss"), params,
                               f"the store {store.path}")
