"""`kvtier rollout`: the controlled rollout against an endpoint, with the rollback rule."""

SUMMARY = "the controlled rollout: GPU-only, +CPU tier, +cold (file) tier if justified, with the rollback rule"
EXAMPLE = ("kvtier rollout --endpoint http://127.0.0.1:8000 --requests 64 --concurrency 1,2,4 "
           "--gpu-blocks 48 --cpu-blocks 256 --cold-blocks 1024 --store rollout.duckdb")


def add_arguments(parser) -> None:
    parser.add_argument("--endpoint", required=True, help="base URL of the engine (OpenAI-compatible)")
    parser.add_argument("--trace", help="trace that drives the load (default: the bundled Mooncake trace)")
    parser.add_argument("--offset", type=int, default=0, help="skip this many trace requests")
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level and phase")
    parser.add_argument("--concurrency", default="1,2,4", help="the ramp, e.g. 1,2,4")
    parser.add_argument("--max-tokens", type=int, default=8, help="output tokens per request")
    parser.add_argument("--max-blocks", type=int, default=32, help="trace blocks per prompt, at most")
    parser.add_argument("--block-tokens", type=int, default=16, help="tokens per engine block")
    parser.add_argument("--gpu-blocks", type=int, default=48)
    parser.add_argument("--cpu-blocks", type=int, default=256, help="the small CPU tier of phase two")
    parser.add_argument("--cold-blocks", "--file-blocks", dest="cold_blocks", type=int, default=1024,
                        help="the cold (file) tier of phase three")
    parser.add_argument("--min-cold-gain", "--min-file-gain", dest="min_cold_gain", type=float, default=0.02,
                        help="add the cold tier only if it serves this share more prompt tokens (simulated)")
    parser.add_argument("--fs-json", help="the output of `kvtier probe fs --json`: skip the file tier if "
                                          "a measured cold promotion costs as much as recomputing")
    parser.add_argument("--ttft-p99-budget-s", type=float, default=2.0)
    parser.add_argument("--itl-p99-budget-s", type=float, default=0.1)
    parser.add_argument("--sustained-s", type=int, default=300, help="how long a breach must last")
    parser.add_argument("--window-s", type=int, default=120, help="p99 window")
    parser.add_argument("--operator", action="store_true",
                        help="a real engine: write each phase's tiers to --config-out and wait for Enter")
    parser.add_argument("--config-out", default="rollout-next-tiers.json", help="with --operator")
    parser.add_argument("--store", help="store the per-request rows in this DuckDB store")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    import sys

    from kvtier.collector import json_text
    from kvtier.rollout.from_args import run_from_args
    from kvtier.signals import stop_on_signals

    with stop_on_signals():  # SIGTERM/SIGHUP stop it as Ctrl-C does: rows stored so far stay
        report = run_from_args(args, progress=lambda line: print(line, file=sys.stderr))
    if args.json:
        print(json_text.dumps(report.to_dict()))
    else:
        from kvtier.rollout.from_args import render_table

        print(render_table(report))
    return 0
