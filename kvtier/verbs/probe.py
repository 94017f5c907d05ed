"""`kvtier probe`: active probes (load, transfer, fs, headroom)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from kvtier.errors import KvtierError

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
    try:
        result = _RUNNERS[args.probe](args)
    except ValueError as error:
        raise KvtierError(str(error)) from None
    body = result.to_dict()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(body, indent=2) + "\n")
    print(json.dumps(body) if args.json else render(body))
    return 0


def _progress():
    from kvtier import progress

    return (lambda line: print(line, file=sys.stderr)) if progress.enabled() else (lambda line: None)


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated integers, got {text!r}") from None


def _transfer(args):
    from probes.active.stats import parse_sizes

    from probes.active.transfer import DEFAULT_SIZES, TransferConfig, run_transfer

    if args.torch_threads is not None:
        import torch

        if args.torch_threads < 1:
            raise ValueError(f"--torch-threads must be >= 1, got {args.torch_threads}")
        torch.set_num_threads(args.torch_threads)
    sizes = parse_sizes(args.sizes) if args.sizes else DEFAULT_SIZES
    return run_transfer(TransferConfig(sizes, repeats=args.repeats), progress=_progress())


def _fs(args):
    from probes.active.stats import parse_sizes

    from probes.active.fs import FsConfig, run_fs

    if not Path(args.dir).is_dir():
        raise KvtierError(f"--dir {args.dir!r} is not a folder")
    extra = {"sizes_bytes": parse_sizes(args.sizes)} if args.sizes else {}
    return run_fs(FsConfig(args.dir, threads=_ints(args.threads, "threads"), blocks=args.blocks,
                           direct=args.direct, **extra), progress=_progress())


def _bytes(text: str) -> int:
    """One size; ``0`` allowed (no margin, no reserve)."""
    from probes.active.stats import parse_sizes

    return 0 if text.strip() == "0" else parse_sizes(text)[0]


class _WithBlocks:
    def __init__(self, headroom, block_bytes):
        self.headroom, self.block_bytes = headroom, block_bytes

    def to_dict(self) -> dict:
        body = self.headroom.to_dict()
        if self.block_bytes:
            body["block_bytes"] = self.block_bytes
            body["safe_blocks"] = self.headroom.blocks(self.block_bytes)
        return body


def _headroom(args):
    from probes.active.stats import parse_sizes

    from probes.active.headroom import HeadroomConfig, measure_headroom

    config = HeadroomConfig(margin_fraction=args.margin_fraction, margin_min_bytes=_bytes(args.margin_min),
                            reserve_bytes=_bytes(args.reserve))
    block = parse_sizes(args.block_bytes)[0] if args.block_bytes else None
    return _WithBlocks(measure_headroom(config), block)


def _load(args):
    from kvtier.load import run_load_from_args

    return run_load_from_args(args, _ints(args.concurrency, "concurrency"), _progress())


_RUNNERS = {"transfer": _transfer, "fs": _fs, "headroom": _headroom, "load": _load}


def render(body: dict) -> str:
    """A short human summary of a probe's JSON."""
    lines = [f"probe {body['probe']}"]
    for key, value in body.items():
        if key in ("probe", "rows", "requests"):
            continue
        lines.append(f"  {key}: {json.dumps(value) if isinstance(value, (dict, list)) else value}")
    rows = body.get("rows") or []
    if rows:
        columns = list(rows[0])
        lines.append("  " + "  ".join(f"{c:>14}" for c in columns))
        for row in rows:
            lines.append("  " + "  ".join(f"{_fmt(row[c]):>14}" for c in columns))
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
