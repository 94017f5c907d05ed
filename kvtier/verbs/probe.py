"""`kvtier probe`: active probes (load, transfer, fs, headroom)."""

from kvtier.verbs import not_yet

SUMMARY = "active probes: load (TTFT/ITL under load), transfer, fs (file tier), headroom (host memory)"
EXAMPLE = "kvtier probe transfer --json"
PROBES = ("load", "transfer", "fs", "headroom")


def add_arguments(parser) -> None:
    parser.add_argument("probe", choices=PROBES, help="which probe to run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    raise not_yet("probe", 6, f"the '{args.probe}' active probe")
