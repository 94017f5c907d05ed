"""`kvtier probe`: active probes (load, transfer, fs, headroom)."""

SUMMARY = "active probes: load (TTFT/ITL under load), transfer, fs (file tier), headroom (host memory)"
EXAMPLE = "kvtier probe transfer --json --out probes/transfer.json"
PROBES = ("load", "transfer", "fs", "headroom")


def add_arguments(parser) -> None:
    parser.add_argument("probe", choices=PROBES, help="which probe to run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", help="also write the JSON result to this file")
    io = parser.add_argument_group("transfer and fs")
    io.add_argument("--sizes", help="block sizes, e.g. 64KiB,1MiB,4MiB (default: per probe)")
    io.add_argument("--repeats", type=int, default=20, help="transfer: timed copies per size")
    io.add_argument("--torch-threads", type=int, help="transfer: torch intra-op threads (default: torch's)")
    io.add_argument("--dir", default=".", help="fs: folder on the filesystem to measure (default .)")
    io.add_argument("--threads", default="1,4", help="fs: thread counts, e.g. 1,4,16")
    io.add_argument("--blocks", type=int, default=32, help="fs: files per size and thread count")
    io.add_argument("--direct", default="auto", help="fs: O_DIRECT auto|on|off")
    memory = parser.add_argument_group("headroom")
    memory.add_argument("--margin-fraction", type=float, default=0.10,
                        help="keep this share of the memory bound free (default 0.10)")
    memory.add_argument("--margin-min", default="1GiB", help="and at least this much (default 1GiB)")
    memory.add_argument("--reserve", default="0", help="bytes kept for known needs (e.g. 4GiB)")
    memory.add_argument("--block-bytes", help="also say how many KV blocks of this size fit")
    load = parser.add_argument_group("load")
    load.add_argument("--url", default="http://127.0.0.1:8000", help="OpenAI-compatible server")
    load.add_argument("--trace", help="trace file (Mooncake, WEKA, Bailian) whose prefixes to replay")
    load.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    load.add_argument("--concurrency", default="1,2,4", help="concurrency ramp, e.g. 1,2,4,8")
    load.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    load.add_argument("--block-tokens", type=int, default=16,
                      help="tokens per trace block id (use the engine's block size)")
    load.add_argument("--max-blocks", type=int, default=32, help="cap on blocks per prompt")
    load.add_argument("--vocab-size", type=int, default=512,
                      help="prompt token ids stay below this (the server's vocabulary)")
    load.add_argument("--offset", type=int, default=0, help="skip this many trace requests first")
    load.add_argument("--phase", help="tier configuration name for the rows, when the server does not say")
    load.add_argument("--store", help="DuckDB store for the per-request rows")


def run(args) -> int:
    from probes.active.commands import run_probe

    return run_probe(args)
