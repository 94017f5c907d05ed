"""`kvtier recommend`: train the admission model, sweep thresholds, write a report and engine configs"""

from __future__ import annotations

from pathlib import Path
from kvtier.errors import KvtierError

SUMMARY = "train the admission model, sweep thresholds, write a report and engine configs"
EXAMPLE = ("kvtier recommend --trace conversation_trace.jsonl --gpu-tokens 1M --cpu-tokens 2.5M "
           "--engine all --out reco/\n  kvtier recommend --check reco/recommendation.json "
           "--store kvtier.duckdb   # after kvtier push: did its predictions hold?")


def add_arguments(parser) -> None:
    from kvtier.policy.writers import ENGINES
    from kvtier.verbs.recommend_check import add_arguments as add_check_arguments
    from kvtier.verbs.trace_args import add_trace_arguments

    parser.add_argument("--trace", help="trace file or folder")
    parser.add_argument("--store", help="a kvtier DuckDB store")
    parser.add_argument("--engine", default="all", choices=(*ENGINES, "all"),
                        help=f"{', '.join(ENGINES)} or all")
    parser.add_argument("--out", default="kvtier-out/recommendation", help="output folder")
    parser.add_argument("--gpu-tokens",
                        help="the deployed GPU prefix-cache capacity (default: what the "
                             "engine reported, when the collector scraped its /metrics into "
                             "--store: vLLM's num_gpu_blocks; else 1M tokens, named as a "
                             "default in the report)")
    parser.add_argument("--cpu-tokens", default="auto",
                        help="the CPU tier: auto (default: the knee of the LRU curve, where the "
                             "next GiB frees less than --min-gain-per-gib of a prefill server, "
                             "capped at the host headroom) or a capacity that fixes it")
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
                           "at it less a safety margin of max(10%%, 1 GiB), and push checks it "
                           "(default: this host's headroom, measured now)")
    host.add_argument("--headroom-json",
                      help="the output of `kvtier probe headroom --json`: cap CPU sizes at its "
                           "safe_bytes (available less the probe's margin and reserve)")
    parser.add_argument("--cold-tokens", default="auto",
                        help="vLLM: the file (cold) tier: auto (default: the knee of the curve "
                             "above GPU + CPU at the cold promotion's cost, capped at the free "
                             "space of --cold-path, never sized to it), 0 for none, or a capacity")
    parser.add_argument("--min-gain-per-gib", type=float, default=0.001,
                        help="the knee: the share of one prefill server's time the next GiB of "
                             "a tier must free (default 0.001, i.e. 0.1%%)")
    parser.add_argument("--ttft-slo-s", type=float,
                        help="p99 TTFT budget in seconds: the verdict checks promotions fit it, "
                             "and the recommendation carries the rollback rule with it")
    parser.add_argument("--itl-slo-s", type=float,
                        help="p99 inter-token latency budget of the rollback rule (with --ttft-slo-s)")
    parser.add_argument("--cold-path", help="vLLM: the file tier's absolute directory (without "
                                            "it the file tier is decided but not written)")
    parser.add_argument("--cost-params", metavar="FILE",
                        help="cost parameters fitted by kvtier calibrate --out (its KV bytes per "
                             "token too): they replace the defaults and the store's per-event "
                             "medians; the report marks them calibrated")
    parser.add_argument("--fs-json",
                        help="the output of `kvtier probe fs --json`: the measured cold-promotion "
                             "cost, weighed against recompute before adding a file tier")
    parser.add_argument("--next-use-policy", action="store_true",
                        help="vLLM: also fit kvtier's learned cache policy (evicts the blocks "
                             "whose conversation comes back last) at the recommended sizes and "
                             "write next-use-policy.json for it when, replayed under vLLM's "
                             "semantics, it is not below vLLM's LRU on later time (reported "
                             "beside vLLM's store_threshold 2, and flagged when below it)")
    parser.add_argument("--max-requests", type=int, help="use only the first N requests")
    parser.add_argument("--coarsen", type=int, default=1,
                        help="merge K consecutive prefix blocks into one (exact prefix identity)")
    add_trace_arguments(parser)
    add_check_arguments(parser)
    from kvtier.verbs.recommend_live import add_live_curves_argument

    add_live_curves_argument(parser)


PHASES = 4
DEFAULT_GPU_TOKENS = "1M"


def run(args) -> int:
    from kvtier.instance_jobs import fleet_instances
    from kvtier.verbs.checks import output_dir, positive
    from kvtier.verbs.common import check_subset

    if getattr(args, "check", None):
        from kvtier.verbs.recommend_check import run_check

        return run_check(args)
    if bool(args.trace) == bool(args.store):
        raise KvtierError("give exactly one of --trace PATH or --store DB")
    output_dir(args.out, "--out")  # before the work, not after it
    check_subset(args)
    positive(args.ttft_slo_s, "--ttft-slo-s")
    positive(args.itl_slo_s, "--itl-slo-s")
    if args.itl_slo_s is not None and args.ttft_slo_s is None:
        raise KvtierError("--itl-slo-s needs --ttft-slo-s (the rollback rule checks both)")
    positive(args.min_gain_per_gib, "--min-gain-per-gib", allow_zero=True)
    if args.cold_path is not None and not Path(args.cold_path).is_absolute():
        raise KvtierError(f"--cold-path {args.cold_path} must be an absolute directory (the "
                          f"engine resolves it from its own working directory), e.g. "
                          f"{Path(args.cold_path).resolve()}")
    args.trace = args.trace or args.store
    if args.store:
        args.format = "store"
    instances = fleet_instances(args)
    from kvtier.verbs.recommend_live import print_live_start

    print_live_start(args, instances)  # the collector's live curve: the starting point
    if instances:
        return _fleet(args, instances)
    rec, written = recommendation(args)
    from kvtier.policy.recommend.input_sources import words

    print(f"verdict: {rec.verdict.words}")
    if rec.verdict.note:
        print(f"  ({rec.verdict.note})")
    for knob in rec.knobs:
        print(f"  {knob.name} = {list(knob.value) if isinstance(knob.value, tuple) else knob.value}")
    if rec.evidence.model is not None and rec.evidence.model.weak:
        print(f"  model flagged: {rec.evidence.model.weak}")
    print("inputs:")
    for line in words(rec.evidence.inputs):
        print(f"  {line}")
    print(f"wrote {len(written)} files to {args.out} (report.md, recommendation.json, configs)")
    return 0


def _fleet(args, instances: tuple[str, ...]) -> int:
    """One recommendation per instance (each its own cache and traffic), in
    ``OUT/instance=NAME/``, and ``OUT/fleet.json`` listing them in instance order."""
    from kvtier.collector import json_text
    from kvtier.instance_jobs import per_instance

    parts = per_instance(instance_recommendation, args, instances)
    index = {"instances": [{"instance": name, **summary} for name, summary in parts]}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    json_text.write(Path(args.out) / "fleet.json", index)
    for name, summary in parts:
        print(f"instance {name}: verdict: {summary['verdict']}")
        for knob, value in summary["knobs"]:
            print(f"  {knob} = {value}")
    print(f"wrote {sum(p['files'] for _, p in parts) + 1} files to {args.out} "
          f"(one folder per instance, and fleet.json)")
    return 0


def instance_recommendation(args) -> dict:
    """One instance's recommendation, written to its own folder; a summary for the index."""
    args.out = str(Path(args.out) / f"instance={args.instance}")
    rec, written = recommendation(args)
    return {"verdict": rec.verdict.words, "note": rec.verdict.note,
            "knobs": [[k.name, k.value] for k in rec.knobs], "out": args.out,
            "files": len(written)}


def recommendation(args):
    """Recommend for one trace (or one instance of it) and write the report: ``(rec, files)``."""
    from kvtier.progress import task
    from kvtier.verbs.common import (capacity_blocks, capacity_model, cost_params_file,
                                     kv_geometry, open_records)
    from kvtier.policy.cost import CostParams, measured_cost_params, parse_servers
    from kvtier.policy.learn.subset import limited
    from kvtier.policy.recommend import report
    from kvtier.policy.recommend.build import Inputs, recommend
    from kvtier.policy.recommend.knobs import for_engines
    from kvtier.policy.recommend.measured import store_costs
    from kvtier.policy.writers import ENGINES

    reader, records = open_records(args)
    records = list(limited(records, args.max_requests, args.coarsen))
    if len(records) < 40:
        raise KvtierError(f"{args.trace}: {len(records)} requests; a recommendation needs "
                          "at least 40 (half to train, half to measure)")
    block_tokens = records[0].block_size_tokens or 16
    model = kv_geometry(args, reader, block_tokens)  # a store's own bytes before a default
    sizes = capacity_model(args, model)  # byte sizes never convert with a default geometry
    gpu_text = args.gpu_tokens or DEFAULT_GPU_TOKENS
    gpu = capacity_blocks(gpu_text, block_tokens, sizes, "--gpu-tokens")
    gpu_source, gpu_note = ("given", None) if args.gpu_tokens else ("default", None)
    recorded_gpu = None if args.gpu_tokens else _recorded_gpu(reader)
    if recorded_gpu is not None:  # what the engine reported beats the default
        gpu, gpu_source, gpu_note = recorded_gpu.tokens // block_tokens, "measured", recorded_gpu.note
    cpu = _size_flag(args.cpu_tokens, block_tokens, sizes, "--cpu-tokens")
    if not gpu or cpu == 0:
        raise KvtierError("--gpu-tokens and --cpu-tokens must be finite and hold at least "
                          f"one {block_tokens}-token block (or --cpu-tokens auto)")
    cold = _size_flag(args.cold_tokens, block_tokens, sizes, "--cold-tokens")
    try:
        params = CostParams(model=model)
        if args.fs_json:
            try:
                params = measured_cost_params(args.fs_json, base=params)
            except (OSError, ValueError) as error:
                raise KvtierError(f"--fs-json {args.fs_json}: {getattr(error, 'strerror', None) or error}; "
                                  "give the output of kvtier probe fs --json") from None
        # a store or segments: what the engine measured beats the defaults and the probe;
        # a calibrate file, given on purpose, beats both
        params, cold_cost = store_costs(reader, params, block_tokens)
        params = cost_params_file(getattr(args, "cost_params", None), params)
        costs = _cost_file(args, reader, gpu)
        if costs is not None and not getattr(args, "cost_params", None) and costs.cost_params:
            params = cost_params_file_body(costs, params)
        inputs = Inputs(gpu, cpu, args.train_fraction, args.seed,
                        parse_servers(args.prefill_servers),
                        host=_host_limit(args), cold_blocks=cold, cold_path=args.cold_path,
                        cold_cost=cold_cost, min_gain_per_gib=args.min_gain_per_gib,
                        ttft_slo_s=args.ttft_slo_s, itl_slo_s=args.itl_slo_s,
                        baseline_tier_config=getattr(args, "tier_config", None),
                        gpu_source=gpu_source, gpu_note=gpu_note,
                        latency=_latency(costs, params, args), costs=_evidence(costs))
    except (OSError, ValueError) as error:  # the inputs' names, as this verb's flags
        from kvtier.errors import flag_names

        raise KvtierError(flag_names(str(error), getattr(args, "_flags", {}))) from None
    with task("recommending", total=PHASES) as advance:
        rec = recommend(records, inputs, params, step=lambda name: advance())
    engines = ENGINES if args.engine == "all" else (args.engine,)
    rec = for_engines(rec, engines)  # each engine's recommendation holds only its own knobs
    written = report.write(rec, Path(args.out), engines)
    written += _calibration(costs, Path(args.out))
    if getattr(args, "next_use_policy", False) and "vllm" in engines:
        written += _next_use_policy(records, rec, args)
    return rec, written


def _next_use_policy(records, rec, args) -> list:
    """The learned vLLM cache policy's file, when it is safe at the recommended sizes."""
    from kvtier.policy.learn.replay import Tiers
    from kvtier.policy.learn.pairs import SIMPLE_RULE_SIGHTINGS
    from kvtier.policy.learn.vllm_deploy import FILE_NAME, POLICY_SETTINGS, next_use_for_vllm, write
    from kvtier.probes.vllm.next_use_twin import NextUseTwin

    blocks = rec.evidence.tiers_blocks
    if blocks is None or blocks.cpu == 0:
        print("next-use policy: not fitted (no CPU tier recommended)")
        return []
    print(f"next-use policy: fitting at GPU {blocks.gpu} / CPU {blocks.cpu} blocks ...")
    result = next_use_for_vllm(records, Tiers(blocks.gpu, blocks.cpu), NextUseTwin,
                               args.train_fraction)
    rule = f"vLLM's store_threshold {SIMPLE_RULE_SIGHTINGS}"
    simple = (f"{rule} (its LRU storing a block on its second request) "
              f"{result.simple_rule_hit_ratio:.4f}")
    if result.readout is None:
        print(f"next-use policy: not written (no readout beat LRU on the training period; "
              f"vLLM LRU {result.lru_hit_ratio:.4f}, {simple} on later time)")
        return []
    words = (f"{result.readout.label()}: token hit ratio {result.learned_hit_ratio:.4f} vs "
             f"vLLM LRU {result.lru_hit_ratio:.4f} and {simple} on later time under vLLM "
             f"semantics")
    path = write(result, Path(args.out))
    if path is None:
        print(f"next-use policy: not written, UNSAFE ({words})")
        return []
    settings = ", ".join(f'"{k}": "{v}"' for k, v in POLICY_SETTINGS.items())
    print(f"next-use policy: wrote {FILE_NAME} ({words}); load it with {settings} in "
          f"kv_connector_extra_config and KVTIER_NEXT_USE_MODEL={path.resolve()}")
    if result.behind_simple_rule is not None:
        print(f"next-use policy: BELOW {rule} by {result.behind_simple_rule * 100:.2f} points "
              f"on later time (the plug-in shadows LRU's order, not that rule's admission): "
              f"vLLM's own \"store_threshold\": {SIMPLE_RULE_SIGHTINGS} with its LRU served "
              f"more on these requests")
    return [path]


def _recorded_gpu(reader):
    """The GPU capacity the engine published, when a collector scraped it into the store."""
    from kvtier.policy.gpu_capacity import recorded_gpu

    return recorded_gpu(reader)


def _host_limit(args) -> HostLimit | None:
    """Told a number (--host-headroom-bytes, --headroom-json), else this host measured now."""
    from kvtier.host import measured_host_limit
    from kvtier.policy.recommend.headroom import from_bytes, from_probe_json

    if getattr(args, "headroom_json", None):
        return from_probe_json(args.headroom_json)
    if getattr(args, "host_headroom_bytes", None) is not None:
        return from_bytes(args.host_headroom_bytes)
    return measured_host_limit()


def _size_flag(text: str, block_tokens: int, model, flag: str) -> int | None:
    """Blocks for a tier-size flag; ``None`` for auto (from the curve)."""
    from kvtier.verbs.common import capacity_blocks

    if str(text).strip().lower() == "auto":
        return None
    blocks = capacity_blocks(text, block_tokens, model, flag)
    if blocks is None:
        raise KvtierError(f"{flag} must be auto or a finite capacity, got {text!r}")
    return blocks


def _calibration(costs, out: Path) -> list:
    """The costs the recommendation rests on and the latency models' held-out check beside
    it: the cost file (``cost-params.json``, for ``simulate``/``recommend --cost-params``)
    and the check the dashboard shows (``recommendation.calibration.json``)."""
    if costs is None:
        return []
    from kvtier.collector.exports.recommendation import CALIBRATION_FILE, COST_FILE
    from kvtier.collector import json_text
    from kvtier.policy.latency.costfile import write_cost_file

    written = [write_cost_file(out / COST_FILE, costs)]
    held = costs.held_out or {}
    if "by_tier_config" in held:
        target = out / CALIBRATION_FILE
        json_text.write(target, {k: held[k] for k in ("split_s", "fit_requests", "by_tier_config")
                                 if k in held})
        written.append(target)
    return written



def _cost_file(args, reader, gpu_blocks: int):
    """The cost file behind the latency promise: ``--cost-params`` as given, else fitted on
    the store's own records (the selected requests, their steps and promotion jobs: the
    engine whose steps it recorded, not a load client's view), else ``None`` (a trace)."""
    path = getattr(args, "cost_params", None)
    if path:
        from dataclasses import replace

        from kvtier.policy.latency.costfile import read_cost_file

        costs = read_cost_file(path)
        engine = costs.engine
        if engine is not None and engine.limits.kv_blocks is None:  # the GPU recommend sizes for
            engine = replace(engine, limits=replace(engine.limits, kv_blocks=gpu_blocks))
        return replace(costs, engine=engine)
    if not hasattr(reader, "tier_config_id"):
        return None
    from kvtier.collector.calibration_inputs import calibration_inputs
    from kvtier.collector.events import CLIENT_ENGINES
    from kvtier.policy.latency.calibration import fit_costs, limits_for

    found = calibration_inputs(args.trace, instance=getattr(args, "instance", None),
                               tier_config=getattr(args, "tier_config", None))
    engines = [e for e in found.engines if e not in CLIENT_ENGINES]
    if len(engines) != 1:
        return None  # no engine recorded these requests, or several: nothing one model fits
    if not found.requests:
        return None
    return fit_costs(found.requests, found.steps, found.jobs,
                     bytes_per_token=found.kv_bytes_per_token,
                     limits=limits_for(engines, found.requests, found.steps, kv_blocks=gpu_blocks),
                     fit_share=args.train_fraction, written_by="kvtier recommend")


def cost_params_file_body(costs, params):
    """``params`` with the single-server costs a fitted cost file holds, as calibrated."""
    from dataclasses import replace

    from kvtier.policy.cost import measured_cost_params
    from kvtier.policy.geometry import geometry_for

    if costs.kv_bytes_per_token and params.model.source == "default":
        params = replace(params, model=geometry_for(costs.kv_bytes_per_token))
    return measured_cost_params({"probe": "calibrate", "cost_params": costs.cost_params}, base=params)


def _evidence(costs) -> tuple:
    """The cost file's engine-model costs as inputs, each with the observations behind it."""
    from kvtier.policy.recommend.values import InputSource

    if costs is None:
        return ()
    source = lambda c: c.source if c.source != "measured" or costs.written_by == "kvtier recommend" \
        else "calibrated"  # noqa: E731  (a cost file given: calibrated)
    return tuple(InputSource(c.name, c.value, source(c), c.note, c.observations)
                 for c in costs.costs if c.name.startswith(("step.", "admission")))


def _latency(costs, params, args):
    """The latency model that may promise TTFT (``choice.choose_for``); ``None`` on a trace."""
    from kvtier.policy.latency.choice import choose_for

    return None if costs is None else choose_for(costs, params)
