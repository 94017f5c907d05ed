"""`kvtier push`: apply a recommendation to an engine config file, atomically, with a diff and guardrails"""

SUMMARY = "apply a recommendation to an engine config file, atomically, with a diff and guardrails"
EXAMPLE = "kvtier push --recommendation reco/recommendation.json --engine vllm --config vllm.yaml"

ENGINES = ("vllm", "trtllm", "lmcache", "sglang", "dynamo")
FILES = ("vllm: .json (the --kv-transfer-config object) or .yaml (vllm serve --config); "
         "trtllm: .yaml (trtllm-serve --config) or .json (per-class retention for the gateway); "
         "lmcache: .yaml (LMCACHE_CONFIG_FILE); "
         "sglang: .args (one launch flag per line); dynamo: .env (KVBM variables)")


def add_arguments(parser) -> None:
    parser.add_argument("--recommendation", required=True,
                        help='recommendation JSON: {"settings": {...}, "guardrails": {...}}')
    parser.add_argument("--engine", required=True, choices=ENGINES, help="the engine to configure")
    parser.add_argument("--config", required=True, help=f"the engine config file to update ({FILES})")
    parser.add_argument("--host-headroom-bytes", type=int, default=None,
                        help="measured host DRAM headroom; overrides the recommendation's guardrail")
    parser.add_argument("--dry-run", action="store_true", help="show the diff, change nothing")


def run(args) -> int:
    from dataclasses import replace

    from kvtier.errors import KvtierError
    from policy.writers.push import PushRefused, apply, load_recommendation, plan

    try:
        settings, guardrails = load_recommendation(args.recommendation)
        if args.host_headroom_bytes is not None:
            guardrails = replace(guardrails, host_headroom_bytes=args.host_headroom_bytes)
        push = plan(settings, guardrails, args.engine, args.config)
    except (PushRefused, ValueError) as exc:
        raise KvtierError(f"push refused: {exc}") from None
    print(push.diff if push.changed else f"{push.path}: already up to date, nothing to change",
          end="" if push.changed else "\n")
    for note in push.notes:
        print(f"note: {note}")
    if args.dry_run or not push.changed:
        if args.dry_run and push.changed:
            print("dry run: nothing written")
        return 0
    try:
        backup = apply(push)
    except OSError as exc:
        raise KvtierError(f"push failed writing {push.path}: {exc.strerror or exc}") from None
    print(f"wrote {push.path}" + (f" (backup: {backup})" if backup else " (new file)"))
    return 0
