"""`kvtier demo`: the main job on embedded defaults."""

SUMMARY = "run kvtier end to end on a bundled real trace (Mooncake conversation, Apache-2.0)"
EXAMPLE = "kvtier demo --out kvtier-out"


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="kvtier-out", help="output folder (store, segments, reports)")
    parser.add_argument("--trace", help="use this trace instead of the bundled one")
    parser.add_argument("--max-requests", type=int, help="replay only the first N requests")


def run(args) -> int:
    from pathlib import Path

    from kvtier.demo import DemoConfig, run_demo

    run_demo(DemoConfig(Path(args.out), Path(args.trace) if args.trace else None, args.max_requests))
    return 0
