"""`kvtier calibrate`: fit the cost model to an engine's measured latencies, and check the
simulator against what that engine did"""

from __future__ import annotations

SUMMARY = "fit cost parameters to a store's measured latencies; check the simulator against the engine"
EXAMPLE = ("kvtier calibrate kvtier-out/kvtier.duckdb --instance node-1 --gpu-blocks 95 "
           "--cpu-blocks 128 --out kvtier-out/cost-params.json")


def add_arguments(parser) -> None:
    parser.add_argument("store", help="a kvtier store (DuckDB file) an engine probe wrote into, or "
                                      "the folder of Parquet segments it exports")
    parser.add_argument("--instance", help="only this serving instance's records (default: all)")
    parser.add_argument("--engine", help="only this engine's records (vllm, reference; default: all "
                                         "with a tier split)")
    parser.add_argument("--tier-config", help="only requests served with this tier configuration "
                                              "(a rollout phase, e.g. gpu+cpu), and the steps and "
                                              "promotion jobs of that phase")
    parser.add_argument("--gpu-blocks", type=int,
                        help="the engine's GPU prefix-cache capacity in blocks, for the tier-split "
                             "check and the engine model's admission (vLLM: num_gpu_blocks less its "
                             "null block)")
    parser.add_argument("--cpu-blocks", type=int, default=0, help="CPU tier capacity in blocks")
    parser.add_argument("--cold-blocks", type=int, default=0, help="cold tier capacity in blocks")
    parser.add_argument("--semantics", default="vllm", choices=("vllm", "exclusive", "trtllm"),
                        help="how the engine moves blocks between tiers (default vllm)")
    parser.add_argument("--cpu-policy", default="lru", help="the CPU tier's eviction policy")
    parser.add_argument("--store-threshold", type=int, default=0,
                        help="the engine's store_threshold (vLLM: a block stored in the CPU tier "
                             "on its N-th offer; default 0: every block)")
    parser.add_argument("--gpu-sightings", type=int, default=0,
                        help="the engine ran kvtier's GPU prefix-cache filter "
                             "(kvtier_gpu_sightings N: a block cached from its N-th request; "
                             "default 0: every block)")
    parser.add_argument("--prefill-servers", type=int, default=1,
                        help="prefill servers of the TTFT queue model (default 1)")
    parser.add_argument("--max-running", type=int,
                        help="engine model: most requests a step runs (vLLM max_num_seqs, the reference "
                             "engine's max_batch_size; default: the most the store shows running)")
    parser.add_argument("--token-budget", type=int,
                        help="engine model: tokens per step (vLLM max_num_batched_tokens; default: none)")
    parser.add_argument("--chunked-prefill", action="store_true",
                        help="engine model: split prompts over the token budget across steps")
    parser.add_argument("--first-token", default="auto", choices=("auto", "step_end", "own_prefill"),
                        help="engine model: a prompt's first token at the end of its step (vLLM) or "
                             "right after its own prefill (the reference engine); auto: own_prefill "
                             "when every record is the reference engine's")
    parser.add_argument("--promotions", default="auto", choices=("auto", "queued", "in_step", "load_step"),
                        help="engine model: promoted KV loaded in a step of its own before the "
                             "request computes (load_step: vLLM's offloading connector), inside "
                             "the step that admits and computes it (in_step: the reference "
                             "engine), or over the transfer links while steps run on (queued); "
                             "auto: in_step when every record is the reference engine's, else "
                             "load_step")
    parser.add_argument("--arrivals", default="auto", choices=("auto", "open", "closed"),
                        help="engine model: replay requests at their recorded times (open), as "
                             "closed-loop clients that send the next request when the last ends "
                             "(closed), or closed when most requests chain so (auto, default)")
    parser.add_argument("--fit-share", type=float, default=0.5,
                        help="engine model: fit on this earliest share of the requests, check on the "
                             "rest (default 0.5)")
    parser.add_argument("--out", help="write the fitted parameters here (kvtier simulate --cost-params)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from pathlib import Path

    from kvtier.errors import KvtierError
    from kvtier.verbs.common import print_json
    from kvtier.policy.calibrate import calibrate

    from kvtier.verbs.checks import output_file

    store = Path(args.store)
    if not store.exists():
        raise KvtierError(f"no store at {store} (kvtier collect or kvtier demo writes one)")
    if args.out:
        output_file(args.out, "--out")
    for flag, value, least in (("--gpu-blocks", args.gpu_blocks, 1), ("--cpu-blocks", args.cpu_blocks, 0),
                               ("--cold-blocks", args.cold_blocks, 0),
                               ("--prefill-servers", args.prefill_servers, 1),
                               ("--max-running", args.max_running, 1),
                               ("--token-budget", args.token_budget, 1)):
        if value is not None and value < least:
            raise KvtierError(f"{flag} must be >= {least}, got {value}")
    inputs = _read(args, store)
    requests, jobs, steps = list(inputs.requests), list(inputs.jobs), list(inputs.steps)
    bytes_per_token = inputs.kv_bytes_per_token
    if not requests:
        raise KvtierError(f"{store} holds no engine request records with a tier split"
                          + (f" for instance {args.instance!r}" if args.instance else ""))
    if not 0 < args.fit_share < 1:
        raise KvtierError(f"--fit-share must be in (0, 1), got {args.fit_share}")
    costs = _fit(args, requests, steps, jobs, bytes_per_token, inputs.engines)
    if not costs.cost_params and costs.engine is None:
        raise KvtierError(costs.held_out.get("single_server_note") or costs.held_out.get("note"))
    engine = dict(costs.held_out)
    if costs.engine is not None and "by_tier_config" in engine:
        engine["params"] = costs.engine.to_dict()
    output = {"store": str(store), "instance": args.instance, "requests": len(requests),
              "promotion_jobs": len(jobs), "step_records": len(steps),
              "kv_bytes_per_token": bytes_per_token, "fitted": dict(costs.cost_params),
              "costs": [c.to_dict() for c in costs.costs], "latency_model": _choice_words(costs)}
    if not costs.cost_params:
        output["single_server_note"] = engine.get("single_server_note", "")
    output["engine_model"] = engine
    if args.gpu_blocks is not None and costs.cost_params:
        fitted = calibrate(requests, jobs, bytes_per_token=bytes_per_token)
        output.update(_check(args, requests, fitted.params, jobs, bytes_per_token))
    if args.out:
        from kvtier.policy.latency.costfile import write_cost_file

        write_cost_file(args.out, costs)
        output["out"] = args.out
    print_json(output) if args.json else print(_text(output))
    return 0


def _limits(args, requests, steps, engines):
    """The scheduler's limits; ``engines``: those of the selected records (the ``auto``
    rules are the reference engine's when every record is that engine's)."""
    from kvtier.policy.latency.calibration import limits_for

    return limits_for(engines, requests, steps, kv_blocks=args.gpu_blocks,
                      max_running=args.max_running, token_budget=args.token_budget,
                      chunked_prefill=args.chunked_prefill, first_token=args.first_token,
                      promotions=args.promotions)


def _fit(args, requests, steps, jobs, bytes_per_token, engines):
    """The cost file for the selected records (every cost, the engine model and its
    held-out check): ``kvtier.policy.latency.calibration.fit_costs``."""
    from kvtier.policy.latency.calibration import fit_costs

    return fit_costs(requests, steps, jobs, bytes_per_token=bytes_per_token,
                     limits=_limits(args, requests, steps, engines), fit_share=args.fit_share,
                     arrivals=args.arrivals, written_by="kvtier calibrate")


def _choice_words(costs) -> dict:
    """Which model a promise from these costs would use, and any failed check."""
    from kvtier.policy.latency.choice import choose_for

    choice = choose_for(costs)
    return {"model": getattr(choice.model, "name", None), "why": choice.why, "flag": choice.flag}


def _check(args, requests, params, jobs, bytes_per_token) -> dict:
    """The tier-split check and the TTFT check, in sample and fitted on the earlier half."""
    from kvtier.errors import KvtierError
    from kvtier.policy.calibrate import calibrate
    from kvtier.policy.engine_check import check_tier_split, check_ttft, replay
    from kvtier.policy.sim.config import SimConfig

    block_tokens = requests[0].block_size_tokens or 16
    try:
        config = SimConfig(gpu_blocks=args.gpu_blocks, cpu_blocks=args.cpu_blocks,
                           cold_blocks=args.cold_blocks, semantics=args.semantics,
                           policy=args.cpu_policy, store_threshold=args.store_threshold,
                           gpu_sightings=args.gpu_sightings, default_block_tokens=block_tokens)
    except ValueError as error:
        raise KvtierError(str(error)) from None
    pairs = replay(requests, config)
    half = len(pairs) // 2
    output = {"tier_split": check_tier_split(pairs).to_dict()}
    try:
        output["ttft"] = check_ttft(pairs, params, args.prefill_servers).to_dict()
        # held out: fitted on the earlier half of the requests, checked on the later half
        earlier = calibrate([r for r, _ in pairs[:half]], jobs, bytes_per_token=bytes_per_token)
        output["ttft_later_half"] = check_ttft(pairs[half:], earlier.params,
                                               args.prefill_servers).to_dict()
    except ValueError as error:  # no request ran alone in one half
        output.setdefault("ttft", None)
        output["ttft_later_half"] = None
        output["ttft_note"] = str(error)
    return output


def _read(args, store):
    """The selected records (``CalibrationInputs``: the engine's own where a load client
    recorded the same requests); one line on stderr saying so, or that a running collector
    holds the store and the segments it exports are read instead."""
    import sys

    from kvtier.collector.calibration_inputs import calibration_inputs
    from kvtier.errors import KvtierError

    try:
        inputs = calibration_inputs(store, instance=args.instance, engine=args.engine,
                                    tier_config=args.tier_config)
    except ValueError as error:  # a segment file that cannot be read
        raise KvtierError(str(error)) from None
    if inputs.note:
        print(f"kvtier calibrate: note: {inputs.note}", file=sys.stderr, flush=True)
    return inputs


def _engine_text(held: dict) -> list[str]:
    if "note" in held:
        return [f"engine model: {held['note']}"]
    params = held["params"]
    cost = ", ".join(f"{k} {v:.3g}" for k, v in params["step_cost"].items())
    lines = [f"engine model fitted on the earliest {held['fit_requests']} requests "
             f"({params['fitted_from']}; max running {params['limits']['max_running']}): {cost}",
             "later requests, predicted / measured ms (ratio); single-server TTFT ratios after |"]
    for check in held["by_tier_config"]:
        p, m, r = check["predicted"], check["measured"], check["ratio"]
        cells = [f"{name.removesuffix('_s').replace('_', ' ')} {p[name] * 1e3:.1f}/{m[name] * 1e3:.1f} "
                 f"({r[name]:.2f})" for name in p]
        single = check["single_server_ratio"]
        old = (" | " + " ".join(f"{single[n]:.2f}" for n in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s"))
               if single else "")
        loop = ", closed loop" if check["closed_loop"] else ""
        lines.append(f"  {check['tier_config_id'] or '-'} ({check['requests']}{loop}): "
                     + ", ".join(cells) + old)
    return lines


def _text(output: dict) -> str:
    lines = [f"{output['requests']} engine requests, {output['promotion_jobs']} promotion jobs, "
             f"{output['step_records']} step records in {output['store']}",
             "single-server model fitted: " + (", ".join(
                 f"{k} {v:.4g}" for k, v in sorted(output["fitted"].items()))
                 or output.get("single_server_note", "nothing"))]
    lines += _engine_text(output["engine_model"])
    choice = output["latency_model"]
    if choice["flag"]:
        lines.append(f"WARNING: {choice['flag']}: it makes no promise")
    lines.append(f"promises would use: {choice['why']}")
    from kvtier.policy.latency.calibration import thin
    from kvtier.policy.latency.costfile import CostEvidence

    few = thin([CostEvidence(**c) for c in output["costs"]])
    if few:
        lines.append("thin evidence: " + "; ".join(few))
    split = output.get("tier_split")
    if split:
        lines.append(f"tier split: {split['exact_requests']}/{split['requests']} requests exact; "
                     f"largest share difference {split['max_share_diff_points']:.2f} points")
        for tier in split["measured_share"]:
            lines.append(f"  {tier:<10} measured {split['measured_share'][tier]:7.2%}  "
                         f"predicted {split['predicted_share'][tier]:7.2%}")
        for name in ("ttft", "ttft_later_half"):
            t = output[name]
            if t is None:
                lines.append(f"{name}: {output.get('ttft_note', 'no request ran alone')}")
                continue
            lines.append(f"{name}: p50 {t['measured_p50_s'] * 1e3:.1f} ms measured, "
                         f"{t['predicted_p50_s'] * 1e3:.1f} predicted ({t['error_p50']:.1%}); p95 "
                         f"{t['measured_p95_s'] * 1e3:.1f} / {t['predicted_p95_s'] * 1e3:.1f} ms "
                         f"({t['error_p95']:.1%})")
    if output.get("out"):
        lines.append(f"wrote {output['out']} (kvtier simulate --cost-params {output['out']})")
    return "\n".join(lines)
