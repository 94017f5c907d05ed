"""`kvtier simulate`: what-if replay of a trace against tier sizes and cache policies"""

from __future__ import annotations

from kvtier.errors import KvtierError

SUMMARY = "what-if replay of a trace against tier sizes and cache policies"
EXAMPLE = "kvtier simulate --trace conversation_trace.jsonl --gpu-tokens 200000 --cpu-tokens 2000000 --policy lru --json"



def add_arguments(parser) -> None:
    from kvtier.policy.sim.policies import policy_names
    from kvtier.verbs.arg_types import int_at_least, positive_finite
    from kvtier.verbs.trace_args import add_policy_module_argument, add_trace_arguments

    parser.add_argument("--trace", help="trace file or folder (Mooncake, WEKA, Bailian, store)")
    parser.add_argument("--gpu-tokens", help="GPU tier capacity: 4e6, 10M, 16GiB (with --model) or inf")
    parser.add_argument("--cpu-tokens", help="CPU tier capacity (default: no CPU tier)")
    parser.add_argument("--cold-tokens", help="cold (file) tier capacity (default: none)")
    parser.add_argument("--policy", default="lru",
                        help=f"eviction policy in every tier ({', '.join(policy_names('exclusive'))}"
                             f", or one a --policy-module registers), or an engine's semantics "
                             f"({', '.join(ENGINE_PRESETS)})")
    parser.add_argument("--cpu-policy", default="lru",
                        help=f"vllm: the CPU tier's eviction_policy "
                             f"({', '.join(policy_names('vllm'))})")
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
    parser.add_argument("--time-scale", type=positive_finite, default=1.0,
                        help="multiply arrival times (0.5 doubles the load) for the TTFT estimate")
    parser.add_argument("--prefill-servers", type=int_at_least(1), default=1,
                        help="prefill servers sharing the queue in the TTFT estimate (default 1)")
    parser.add_argument("--cost-params", metavar="FILE",
                        help="cost parameters for the TTFT estimate: kvtier calibrate --out (or a "
                             "probe's --out JSON); its KV bytes per token replace --model's")
    parser.add_argument("--sweep", nargs="?", const="",
                        help="print a hit-ratio curve over GPU capacities (comma-separated; "
                             "default grid when empty); one pass for lru")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_trace_arguments(parser)
    add_policy_module_argument(parser)


ENGINE_PRESETS = {"vllm": "vllm", "trtllm": "trtllm"}
# a replay is about a second of work per MiB of segments on this kind of host; below this
# much, worker processes cost more to start than they save (see kvtier.instance_jobs)
PARALLEL_BYTES = 1 << 20
DEFAULT_SWEEP = ("1e4", "3e4", "1e5", "3e5", "1e6", "3e6", "1e7", "3e7", "1e8", "inf")


def run(args) -> int:
    from kvtier.instance_jobs import fleet_instances
    from kvtier.verbs.common import print_json

    _check_policies(args)
    _check_combinations(args)
    instances = fleet_instances(args)
    output = _fleet(args, instances) if instances else instance_run(args)[0]
    if args.json:
        print_json(output)
    else:
        print(_text(output))
    return 0


def _check_policies(args) -> None:
    """``--policy`` and ``--cpu-policy`` against the registry, after ``--policy-module``s
    registered theirs (worker processes load them again: see :func:`instance_run`)."""
    from kvtier.policy.sim.policies import policy_names
    from kvtier.verbs.trace_args import load_policy_modules

    load_policy_modules(args.policy_module)
    allowed = (*policy_names("exclusive"), *ENGINE_PRESETS)
    if args.policy not in allowed:
        raise KvtierError(f"--policy {args.policy}: unknown; allowed: {', '.join(allowed)} "
                          "(a policy written in Python joins with --policy-module)")
    if args.cpu_policy not in policy_names("vllm"):
        raise KvtierError(f"--cpu-policy {args.cpu_policy}: unknown; allowed: "
                          f"{', '.join(policy_names('vllm'))}")


def _check_combinations(args) -> None:
    """Flags that would be silently ignored together are refused, naming both."""
    if args.sweep is not None:
        given = [f"{flag} {value}" for flag, value in (("--gpu-tokens", args.gpu_tokens),
                                                       ("--cpu-tokens", args.cpu_tokens),
                                                       ("--cold-tokens", args.cold_tokens)) if value]
        if given:
            raise KvtierError(f"--sweep draws the curve over GPU capacities of one tier; {given[0]} "
                              "would be ignored: list the capacities in --sweep, or drop --sweep")
    from kvtier.verbs.checks import check_cold_needs_cpu

    check_cold_needs_cpu(args.cold_tokens, args.cpu_tokens)


def instance_run(args) -> tuple[dict, object]:
    """One trace (or one instance of it): the output and, for a replay, its ``WhatIf``."""
    from kvtier.verbs.common import kv_geometry, open_records, peek_block_tokens
    from kvtier.verbs.trace_args import load_policy_modules

    load_policy_modules(args.policy_module)  # a worker process registers them again
    reader, records = open_records(args)
    block_tokens, records = peek_block_tokens(records)
    model = kv_geometry(args, reader, block_tokens)
    outcome = None
    if args.sweep is not None:
        output = _sweep(args, records, block_tokens, model)
    else:
        output, outcome = _replay(args, records, block_tokens, model)
    output["skipped_lines"] = getattr(reader, "skipped", 0)
    return output, outcome


def _fleet(args, instances: tuple[str, ...]) -> dict:
    """Each instance replayed with its own tiers (``--jobs`` at a time), then merged."""
    from kvtier.instance_jobs import per_instance
    from kvtier.policy.fleet import merge_curves, merge_replays

    parts = per_instance(instance_run, args, instances, min_parallel_bytes=PARALLEL_BYTES)
    skipped = sum(output["skipped_lines"] for _, (output, _) in parts)
    if args.sweep is not None:
        return {**merge_curves([(name, output) for name, (output, _) in parts]),
                "skipped_lines": skipped}
    fleet = merge_replays([(name, outcome) for name, (_, outcome) in parts])
    head = {k: parts[0][1][0][k] for k in ("policy", "semantics", "block_tokens", "gpu_blocks",
                                            "cpu_blocks", "cold_blocks")}
    output = {**head, **fleet.to_dict(), "skipped_lines": skipped}
    for row, (_, (one, _)) in zip(output["instances"], parts):
        row["skipped_lines"] = one["skipped_lines"]
    return output


def _gpu_blocks(args, block_tokens: int, model=None) -> int | None:
    from kvtier.verbs.common import capacity_blocks, capacity_model

    blocks = capacity_blocks(args.gpu_tokens, block_tokens, capacity_model(args, model),
                             "--gpu-tokens")
    if blocks == 0:
        raise KvtierError(f"--gpu-tokens {args.gpu_tokens}: the GPU tier needs at least one "
                          f"{block_tokens}-token block (every hit is served from it)")
    return blocks


def build_config(args, block_tokens: int, model) -> SimConfig:
    from kvtier.verbs.common import capacity_blocks, capacity_model
    from kvtier.policy.sim.config import PriorityRule, SimConfig

    if args.gpu_tokens is None:
        raise KvtierError("--gpu-tokens is required (or use --sweep for a capacity curve)")
    semantics = ENGINE_PRESETS.get(args.policy, "exclusive")
    policy = args.cpu_policy if semantics == "vllm" else args.policy
    if semantics == "trtllm":
        policy = "priority"
    return SimConfig(
        gpu_blocks=_gpu_blocks(args, block_tokens, model),
        cpu_blocks=capacity_blocks(args.cpu_tokens, block_tokens, capacity_model(args, model),
                                   "--cpu-tokens"),
        cold_blocks=capacity_blocks(args.cold_tokens, block_tokens, capacity_model(args, model),
                                    "--cold-tokens"),
        semantics=semantics, policy=policy, store_threshold=args.store_threshold,
        offload_min_priority=args.offload_min_priority,
        offload_comparison=args.offload_comparison, default_block_tokens=block_tokens,
        priorities=PriorityRule(default_priority=args.default_priority,
                                prefix_blocks=args.prefix_blocks,
                                prefix_priority=args.prefix_priority))


def _replay(args, records, block_tokens: int, model) -> tuple[dict, object]:
    from kvtier.policy.cost import CostParams

    from kvtier.policy.whatif import what_if

    config = build_config(args, block_tokens, model)
    if not args.prefill_servers >= 1:
        raise KvtierError(f"--prefill-servers must be >= 1, got {args.prefill_servers}")
    params = _cost_params(args.cost_params, CostParams(model=model))
    engine = _engine_params(args.cost_params)
    from kvtier.policy.latency.models import QueueModel, StepModel

    latency = StepModel(engine) if engine is not None else QueueModel(params, args.prefill_servers)
    outcome = what_if(records, config, latency, time_scale=args.time_scale)
    return {"policy": args.policy, "semantics": config.semantics, "block_tokens": block_tokens,
            "gpu_blocks": config.gpu_blocks, "cpu_blocks": config.cpu_blocks,
            "cold_blocks": config.cold_blocks, **outcome.to_dict()}, outcome


def _engine_params(path):
    """The engine model's parameters in a ``--cost-params`` file (None without the section)."""
    if not path:
        return None
    from kvtier.policy.engine_model.params import read_engine_params

    try:
        return read_engine_params(path)
    except ValueError as error:
        raise KvtierError(f"--cost-params {error}") from None


def _cost_params(path, base):
    """``base`` with the parameters a ``--cost-params`` file measured."""
    from kvtier.verbs.common import cost_params_file

    return cost_params_file(path, base)


def _sweep(args, records, block_tokens: int, model) -> dict:
    from kvtier.verbs.common import capacity_blocks, capacity_model
    from kvtier.policy.sim.config import SimConfig
    from kvtier.policy.sim.policies import policy_names

    capacities = args.sweep.split(",") if args.sweep else list(DEFAULT_SWEEP)
    blocks = [capacity_blocks(c.strip(), block_tokens, capacity_model(args, model), "--sweep")
              for c in capacities]
    if args.policy == "lru":
        from kvtier.policy.curves import lru_curve

        curve = lru_curve(records, block_tokens)
        ratios = [curve.token_hit_ratio(b) for b in blocks]
        method, prompt_tokens = "stack_distance", curve.prompt_tokens
    elif args.policy in policy_names("exclusive"):
        from kvtier.policy.sim.simulator import simulate

        records = list(records)
        results = [simulate(records, SimConfig(gpu_blocks=b, policy=args.policy,
                                               default_block_tokens=block_tokens))
                   for b in blocks]
        ratios = [r.token_hit_ratio for r in results]
        method, prompt_tokens = "replay", results[0].prompt_tokens if results else 0
    else:
        raise KvtierError(f"--sweep replays a single GPU tier; --policy must be one of "
                          f"{', '.join(policy_names('exclusive'))}, got {args.policy!r}")
    points = [{"gpu_tokens": None if b is None else b * block_tokens, "gpu_blocks": b,
               "token_hit_ratio": r} for b, r in zip(blocks, ratios)]
    return {"policy": args.policy, "method": method, "block_tokens": block_tokens,
            "prompt_tokens": prompt_tokens, "curve": points}


def _text(output: dict) -> str:
    if "curve" in output:
        lines = [f"{output['policy']} hit-ratio curve ({output['method']}, "
                 f"{output['block_tokens']}-token blocks)", f"{'GPU tokens':>14}  token hit ratio"]
        for point in output["curve"]:
            size = "unlimited" if point["gpu_tokens"] is None else f"{point['gpu_tokens']:,}"
            lines.append(f"{size:>14}  {point['token_hit_ratio']:.4f}")
        if output.get("instances"):
            lines.append(f"(the fleet of {len(output['instances'])} instances, each with these "
                         "capacities: " + ", ".join(p["instance"] for p in output["instances"]) + ")")
        return "\n".join(lines)
    prompt = max(output["prompt_tokens"], 1)
    rows = [("GPU hit", output["gpu_hit_tokens"]), ("CPU promotion", output["cpu_promotion_tokens"]),
            ("cold promotion", output["cold_promotion_tokens"]),
            ("recompute", output["recompute_tokens"])]
    lines = [f"{output['requests']:,} requests, {output['prompt_tokens']:,} prompt tokens; "
             f"policy {output['policy']} ({output['semantics']})",
             f"token hit ratio {output['token_hit_ratio']:.4f}"]
    lines += [f"  {name:<15}{tokens:>16,} tokens  {tokens / prompt:7.2%}" for name, tokens in rows]
    defaults = [k for k, v in output["parameter_sources"].items() if v == "default"]
    lines.append(f"TTFT p50 {output['ttft_p50_s'] * 1e3:.1f} ms, p95 {output['ttft_p95_s'] * 1e3:.1f} ms, "
                 f"p99 {output['ttft_p99_s'] * 1e3:.1f} ms (estimate; "
                 + (f"documented defaults for {len(defaults)} of "
                    f"{len(output['parameter_sources'])} parameters)" if defaults else "measured)"))
    if output["utilisation"] > 1:
        lines.append(f"warning: prefill utilisation {output['utilisation']:.2f} > 1: the queue grows "
                     "without bound; add --prefill-servers or raise --time-scale")
    for part in output.get("instances", ()):
        lines.append(f"  instance {part['instance']}: {part['requests']:,} requests, token hit "
                     f"ratio {part['token_hit_ratio']:.4f}, TTFT p99 {part['ttft_p99_s'] * 1e3:.1f} ms")
    if output.get("skipped_lines"):
        lines.append(f"skipped {output['skipped_lines']} bad trace lines")
    return "\n".join(lines)
