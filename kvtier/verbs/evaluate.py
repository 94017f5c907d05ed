"""`kvtier evaluate`: replay a trace's later part under each CPU-tier policy, learned included"""

from __future__ import annotations

from kvtier.errors import KvtierError

SUMMARY = ("compare CPU-tier policies (LRU, ARC, S3-FIFO, learned admission and retention, "
           "Belady) on later time")
EXAMPLE = ("kvtier evaluate --trace conversation_trace.jsonl --gpu-tokens 1M --cpu-tokens 2.5M "
           "--policies lru,arc,s3fifo,learned,belady --json")


def default_policies() -> tuple[str, ...]:
    """The registry's built-in policies evaluate compares, with ``learned`` before the
    bounds that need the future."""
    from kvtier.policy.sim.policies import POLICIES, policy_names

    base = policy_names("exclusive", evaluate=True)
    bounds = tuple(name for name in base if POLICIES[name].uses_future)
    return (*(name for name in base if name not in bounds), "learned", *bounds)


def add_arguments(parser) -> None:
    from kvtier.policy.learn.baselines.external import EXTERNAL
    from kvtier.policy.sim.policies import policy_names
    from kvtier.verbs.trace_args import add_policy_module_argument, add_trace_arguments

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
    parser.add_argument("--policies", default=",".join(default_policies()),
                        help=f"comma-separated: {', '.join(policy_names('exclusive', evaluate=True))}"
                             " (or one a --policy-module registers), learned, learned-logistic, "
                             "learned-next-use (evicts the blocks whose conversation comes back "
                             "last, learned), learned-safe (that order behind an LRU shadow), "
                             "recommended (what recommend would deploy: the admission rule and "
                             "eviction order chosen together on the training period only), "
                             "learned-retention (the model's score, decayed by time since use, "
                             "orders CPU eviction), "
                             "oracle-reused (a diagnostic: admits blocks the trace references "
                             "again, knowing whether but not when), sightings-gpu (a "
                             "diagnostic: the GPU prefix cache too keeps a new block only from "
                             "its second request, as libCacheSim's Bloom-filter row does for "
                             "one cache; kvtier's vLLM connector can apply it)")
    parser.add_argument("--libcachesim", default="",
                        help="also run libCacheSim's policies as one cache of GPU+CPU size on "
                             f"the same block stream, comma-separated: {', '.join(EXTERNAL)}, "
                             "or 'all' (needs the libcachesim package)")
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
    parser.add_argument("--candidates", action="store_true",
                        help="with recommended: also deploy every pair it chose among on the "
                             "evaluated requests, beside its validation figure (whether a "
                             "shortfall is the choice's or the candidates'; one replay per pair)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_trace_arguments(parser)
    add_policy_module_argument(parser)


def run(args) -> int:
    from kvtier.instance_jobs import fleet_instances, per_instance
    from kvtier.verbs.common import print_json

    instances = fleet_instances(args)
    if instances:  # each instance trains and replays on its own; the rows are merged
        from kvtier.policy.fleet import merge_evaluations

        output = merge_evaluations(per_instance(instance_evaluation, args, instances))
    else:
        output = evaluation(args)
    if args.json:
        print_json(output)
    else:
        print(text(output))
    return 0


def instance_evaluation(args) -> dict:
    """One instance's evaluation, with each row's per-request TTFTs for the fleet's merge."""
    return evaluation(args, keep_ttft_samples=True)


def evaluation(args, *, keep_ttft_samples: bool = False) -> dict:
    """The evaluation of one trace (or one instance of it)."""
    from kvtier.progress import task
    from kvtier.verbs.checks import check_cold_needs_cpu
    from kvtier.verbs.common import check_subset, kv_geometry
    from kvtier.policy.cost import CostParams
    from kvtier.policy.learn.compare import (RECOMMENDED, add_gap_closed, compare,
                                             evaluated_names, mark_unsafe)
    from kvtier.policy.learn.pairs import most_candidates
    from kvtier.policy.learn.split import Split
    from kvtier.policy.learn.baselines.external import external_rows
    from kvtier.verbs.trace_args import load_policy_modules

    load_policy_modules(args.policy_module)  # a worker process registers them again
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    allowed = evaluated_names()
    bad = [p for p in policies if p not in allowed]
    if bad or not policies:
        raise KvtierError(f"--policies: unknown {', '.join(bad) or '(none)'}; allowed: "
                          f"{', '.join(allowed)}")
    if args.candidates and RECOMMENDED not in policies:
        raise KvtierError(f"--candidates lists the pairs {RECOMMENDED} chose among: add "
                          f"{RECOMMENDED} to --policies")
    check_subset(args)
    check_cold_needs_cpu(args.cold_tokens, args.cpu_tokens)
    if args.train_trace:
        _check_train_is_not_test(args.train_trace, args.trace)
    records, trace = _read(args, args.trace, "--trace")
    if args.train_trace:
        train, train_trace = _read(args, args.train_trace, "--train-trace")
        split = Split.separate(records, train).with_traces(trace, train_trace)
    else:  # its ValueError names --train-fraction (the command line maps the name)
        how = Split.by_count if args.split == "requests" else Split.by_time
        split = how(records, args.train_fraction).with_traces(trace)
    model = kv_geometry(args)
    params = CostParams(model=model)
    servers = _servers(args.prefill_servers, split, params)
    tiers = _tiers(args, records[0].block_size_tokens or 16, model)
    external = _external_names(args.libcachesim)
    # --candidates: one more replay per pair recommended chose among, the chosen one aside
    more = most_candidates() - 1 if args.candidates else 0
    with task("evaluating policies", total=len(policies) + len(external) + more) as advance:
        output = compare(split, tiers, policies, seed=args.seed, params=params,
                         servers=servers, progress=lambda name: advance(),
                         keep_ttft_samples=keep_ttft_samples, importance=True,
                         candidates=args.candidates)
        output["prefill_servers"] = servers
        if external:
            try:
                output["libcachesim"] = external_rows(
                    split.records, split.count_from, tiers.gpu_blocks + tiers.cpu_blocks,
                    external, progress=lambda name: advance(), trace=split.trace)
                add_gap_closed(output["policies"] + output["libcachesim"])
                mark_unsafe(output["policies"] + output["libcachesim"])
            except ValueError as error:
                raise KvtierError(f"--libcachesim: {error}") from None
    output["block_tokens"] = records[0].block_size_tokens
    return output


def _servers(text, split: Split, params: CostParams) -> int:
    from kvtier.policy.cost import parse_servers, servers_for

    try:
        servers = parse_servers(text)
    except ValueError as error:
        raise KvtierError(str(error)) from None
    if servers is None:  # sized on the evaluated requests, so every policy gets the same
        servers = servers_for(split.records[split.count_from:], params)
    return servers


def _external_names(text: str) -> list[str]:
    from kvtier.policy.learn.baselines.external import EXTERNAL

    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if names == ["all"]:
        return list(EXTERNAL)
    bad = [n for n in names if n not in EXTERNAL]
    if bad:
        raise KvtierError(f"--libcachesim: unknown {', '.join(bad)}; allowed: "
                          f"{', '.join(EXTERNAL)}, all")
    return names


def _read(args, path: str, flag: str) -> tuple:
    """The trace's records without their blocks, and its blocks as arrays (read once)."""
    from kvtier.verbs.common import open_records
    from kvtier.policy.learn.subset import limited
    from kvtier.policy.sim.trace import strip_blocks

    args.trace, original = path, args.trace
    try:  # the readers' errors name the file and line
        _, records = open_records(args, flag)
        return strip_blocks(limited(records, args.max_requests, args.coarsen))
    finally:
        args.trace = original


def _check_train_is_not_test(train_trace: str, trace: str) -> None:
    """A model trained on the requests it is scored on looks better than it is."""
    from pathlib import Path

    train, test = Path(train_trace), Path(trace)
    if train.exists() and test.exists() and train.resolve() == test.resolve():
        raise KvtierError(f"--train-trace {train_trace} is the trace under test (--trace {trace}): "
                          "the learned policy would be scored on its own training requests; give "
                          "an earlier trace, or drop --train-trace to train on the first "
                          "--train-fraction of --trace")


def _tiers(args, block_tokens: int, model) -> Tiers:
    from kvtier.verbs.common import capacity_blocks, capacity_model
    from kvtier.policy.learn.replay import Tiers

    if args.gpu_tokens is None or args.cpu_tokens is None:
        raise KvtierError("--gpu-tokens and --cpu-tokens are required (e.g. --gpu-tokens 1M "
                          "--cpu-tokens 2.5M)")
    values = [capacity_blocks(text, block_tokens, capacity_model(args, model), flag, absent=0)
              for text, flag in ((args.gpu_tokens, "--gpu-tokens"),
                                 (args.cpu_tokens, "--cpu-tokens"),
                                 (args.cold_tokens, "--cold-tokens"))]
    if any(v is None for v in values):
        raise KvtierError("capacities must be finite for evaluate (Belady needs a bound)")
    return Tiers(*values)


def text(output: dict) -> str:
    """One row per policy: hit ratio, gap closed, tokens per outcome, TTFT percentiles."""
    servers = output.get("prefill_servers", 1)
    if isinstance(servers, list):  # a fleet: each instance sized its own
        servers = "/".join(str(n) for n in servers)
    lines = [(f"{output['evaluated_requests']:,} evaluated requests after "
              f"{output['train_requests']:,} training requests; GPU {output['gpu_blocks']:,} / "
              f"CPU {output['cpu_blocks']:,} / cold {output['cold_blocks']:,} blocks; TTFT "
              f"through {servers} prefill server(s)"),
             (f"{'policy':<18}{'hit ratio':>10}{'gap closed':>11}{'prefill s':>11}"
              f"{'gap (s)':>9}{'GPU hit':>14}{'CPU promo':>14}{'cold promo':>12}"
              f"{'recompute':>14}{'p50 ms':>11}{'p95 ms':>11}{'p99 ms':>11}")]
    for r in output["policies"]:
        lines.append(f"{r['policy']:<18}{r['token_hit_ratio']:>10.4f}"
                     f"{_share(r.get('gap_closed')):>11}{_seconds(r.get('prefill_s')):>11}"
                     f"{_share(r.get('prefill_gap_closed')):>9}"
                     f"{r['gpu_hit_tokens']:>14,}{r['cpu_promotion_tokens']:>14,}"
                     f"{r['cold_promotion_tokens']:>12,}{r['recompute_tokens']:>14,}"
                     f"{r['ttft_p50_s'] * 1e3:>11,.1f}{r['ttft_p95_s'] * 1e3:>11,.1f}"
                     f"{r['ttft_p99_s'] * 1e3:>11,.1f}{_unsafe(r)}")
    if output.get("libcachesim"):
        lines.append(f"libCacheSim, one cache of {output['gpu_blocks'] + output['cpu_blocks']:,} "
                     f"blocks on the same block stream:")
        for r in output["libcachesim"]:
            lines.append(f"{r['policy']:<18}{r['token_hit_ratio']:>10.4f}"
                         f"{_share(r.get('gap_closed')):>11}{_unsafe(r)}")
    if any(r.get("unsafe") for r in output["policies"] + output.get("libcachesim", [])):
        lines.append("UNSAFE: lost to LRU on the evaluated (later) requests")
    for part in output.get("instances", ()):
        lines.append(f"instance {part['instance']}:")
        lines += ["  " + line for line in text(part).splitlines()]
    importance = None
    for name, info in output["learned"].items():
        if "why" in info:
            lines.append(f"{name}: {info['why']}")
            lines += _followed_lines(info.get("shadow"))
            lines += _candidate_lines(info.get("candidates"))
            continue
        if "readout" in info:
            importance = info.get("importance_later") or importance
            shadow = info.get("shadow")
            followed = ""
            if shadow:
                share = shadow["requests_by_mode"][1] / max(1, sum(shadow["requests_by_mode"]))
                followed = (f", followed the learned order for {share:.0%} of requests "
                            f"({shadow['switches']} switches)")
            lines.append(f"{name}: {info['deploys']}; readout {info['readout']} (chosen on "
                         f"the training period){followed}")
            continue
        held = info["model"]["held_out"]
        if "tau_s" in info:
            tau = "inf (score only)" if info["tau_s"] is None else f"{info['tau_s']:g} s"
            lines.append(f"{name}: tau {tau} (swept on the training period)")
            continue
        auc = "n/a" if held["roc_auc"] is None else f"{held['roc_auc']:.3f}"
        lines.append(f"{name}: threshold {info['threshold']:g} (swept on the training period), "
                     f"held-out ROC AUC {auc}, {info['train_offers']:,} training offers")
    if importance:
        lines.append(_importance_line(importance))
    return "\n".join(lines)


def _followed_lines(shadow: dict | None) -> list[str]:
    """Which ghost the deployed pair's tier followed, for how many of the replayed requests."""
    if not shadow:
        return []
    total = max(1, sum(shadow["requests_by_mode"]))
    shares = ", ".join(f"{name} {n / total:.0%}"
                       for name, n in zip(shadow["names"], shadow["requests_by_mode"]))
    return [f"  behind its shadow the tier followed: {shares} of the replayed requests "
            f"({shadow['switches']} switches)"]


def _candidate_lines(candidates: list[dict] | None) -> list[str]:
    """Every candidate pair's validation and evaluated figures (``--candidates``), and how
    far the chosen one is from the best on the evaluated requests."""
    if not candidates:
        return []
    width = max(len(c["pair"]) for c in candidates)
    lines = [f"  {'candidate pair':<{width}}  {'validation':>10}  {'evaluated':>9}"]
    for c in candidates:
        mark = "*" if c["chosen"] else " "
        lines.append(f"{mark} {c['pair']:<{width}}  {c['validation_hit_ratio']:>10.4f}  "
                     f"{c['evaluated_hit_ratio']:>9.4f}")
    chosen = next(c for c in candidates if c["chosen"])
    best = max(candidates, key=lambda c: c["evaluated_hit_ratio"])
    behind = (best["evaluated_hit_ratio"] - chosen["evaluated_hit_ratio"]) * 100
    lines.append("  * chosen; on the evaluated requests " + (
        "no candidate served more" if best is chosen or behind <= 0 else
        f"{best['pair']} served {behind:.2f} points more (the choice's shortfall; the "
        f"validation slice ranked it {best['validation_hit_ratio']:.4f})"))
    return lines


def _importance_line(importance: dict, top: int = 5) -> str:
    """The next-use model's signals that mattered on later time, largest loss first."""
    fmt = lambda v: "-" if v is None else f"{v:+.3f}"
    parts = [f"{d['feature']} {fmt(d['continuation_auc_drop'])}/{fmt(d['gap_rank_drop'])}"
             for d in importance["features"][:top]]
    return (f"next-use signals on later time (permutation importance over "
            f"{importance['rows']:,} requests: loss of continuation ROC AUC "
            f"{importance['continuation_auc']} / of gap rank correlation "
            f"{importance['gap_rank_correlation']} when shuffled): " + ", ".join(parts))


def _share(value) -> str:
    return "" if value is None else f"{value:.0%}"


def _seconds(value) -> str:
    return "" if value is None else f"{value:,.0f}"


def _unsafe(r: dict) -> str:
    return "  UNSAFE" if r.get("unsafe") else ""
