"""`kvtier demo`: the main job on embedded defaults."""

SUMMARY = ("run kvtier end to end: a slice of a bundled real trace (Mooncake conversation, Apache-2.0) "
           "through the reference engine, GPU-only -> +CPU -> +file, into a store and segments")
EXAMPLE = "kvtier demo --out kvtier-out"


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="kvtier-out", help="output folder (store, segments, reports)")
    parser.add_argument("--trace", help="use this trace instead of the bundled one")
    parser.add_argument("--requests", type=int, default=600, help="trace requests per phase (default 600)")
    parser.add_argument("--no-recommendation", action="store_true",
                        help="stop after the live rollout (skip the analysis and the recommendation)")


def run(args) -> int:
    from pathlib import Path

    from kvtier.demo.live import DemoSlice
    from kvtier.demo.run import DemoConfig, run_demo
    from kvtier.signals import stop_on_signals
    from kvtier.verbs.checks import input_path, output_dir

    out = output_dir(args.out, "--out")
    if args.trace:
        input_path(args.trace, "--trace")
    # SIGTERM/SIGHUP as Ctrl-C: the engine stops, the store keeps what was flushed
    with stop_on_signals():
        run_demo(DemoConfig(out, Path(args.trace) if args.trace else None,
                            DemoSlice(requests=args.requests), recommend=not args.no_recommendation))
    return 0
