"""`kvtier demo`: the main job on embedded defaults."""

SUMMARY = ("run kvtier end to end on bundled real traces through its reference engine: agentic "
           "sessions GPU-only -> +CPU -> +cold at sizes from the curve, then chat traffic with a "
           "copied setting, the rollback rule deciding; a store, segments, a recommendation")
EXAMPLE = "kvtier demo --out kvtier-out"


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="kvtier-out", help="output folder (store, segments, reports)")
    parser.add_argument("--trace", help="replay this trace in act one instead of the bundled "
                                        "agentic sessions")
    parser.add_argument("--requests", type=int,
                        help="act one's requests per phase (default: all 414 of the sessions)")
    parser.add_argument("--chat-requests", type=int, default=300,
                        help="act two's requests per phase (default 300; 0: no act two)")
    parser.add_argument("--no-recommendation", action="store_true",
                        help="size the CPU tier from the curve alone, without the analysis, the "
                             "recommendation and the what-if curves")


def run(args) -> int:
    from pathlib import Path

    from kvtier.demo.run import DemoConfig, run_demo
    from kvtier.errors import KvtierError
    from kvtier.signals import stop_on_signals
    from kvtier.verbs.checks import input_path, output_dir

    for flag, value in (("--requests", args.requests), ("--chat-requests", args.chat_requests)):
        if value is not None and value < (0 if flag == "--chat-requests" else 3):
            raise KvtierError(f"{flag} must be >= {0 if flag == '--chat-requests' else 3}, got {value}")
    out = output_dir(args.out, "--out")
    if args.trace:
        input_path(args.trace, "--trace")
    # SIGTERM/SIGHUP as Ctrl-C: the engine stops, the store keeps what was flushed
    with stop_on_signals():
        run_demo(DemoConfig(out, Path(args.trace) if args.trace else None,
                            args.requests, args.chat_requests, not args.no_recommendation))
    return 0
