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
    from kvtier.collector import json_text
    from kvtier.errors import failure, flag_names
    from kvtier.verbs.checks import output_file

    if args.out:
        output_file(args.out, "--out")  # before the probe runs, not after
    try:
        result = _RUNNERS[args.probe](args)
    except ValueError as error:  # the probes' names, as this verb's flags
        raise KvtierError(flag_names(str(error), getattr(args, "_flags", {}))) from None
    body = result.to_dict()
    print(json_text.dumps(body) if args.json else render(body), flush=True)
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            json_text.write(args.out, body)
        except OSError as error:
            raise failure(f"--out {args.out}: {error.strerror or error}; the result above is "
                          "not saved") from None
    return 0


def _positive_ints(values: tuple[int, ...], flag: str) -> tuple[int, ...]:
    if not values or min(values) < 1:
        raise KvtierError(f"{flag} must be integers >= 1, got {','.join(map(str, values))}")
    return values


def _progress():
    from kvtier import progress

    return (lambda line: print(line, file=sys.stderr)) if progress.enabled() else (lambda line: None)


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated integers, got {text!r}") from None


def _transfer(args):
    from kvtier.probes.active.transfer import DEFAULT_SIZES, TransferConfig, run_transfer

    if args.torch_threads is not None:
        import torch

        if args.torch_threads < 1:
            raise ValueError(f"--torch-threads must be >= 1, got {args.torch_threads}")
        torch.set_num_threads(args.torch_threads)
    if args.repeats < 1:
        raise KvtierError(f"--repeats must be >= 1, got {args.repeats}")
    sizes = _sizes(args.sizes) if args.sizes else DEFAULT_SIZES
    return run_transfer(TransferConfig(sizes, repeats=args.repeats), progress=_progress())


def _sizes(text: str) -> tuple[int, ...]:
    from kvtier.probes.active.stats import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as error:
        raise KvtierError(f"--sizes: {error}") from None


def _fs(args):
    from kvtier.probes.active.fs import FsConfig, run_fs

    from kvtier.errors import failure

    if not Path(args.dir).is_dir():
        raise KvtierError(f"--dir {args.dir!r} is not a folder")
    if args.blocks < 1:
        raise KvtierError(f"--blocks must be >= 1, got {args.blocks}")
    if args.direct not in ("auto", "on", "off"):
        raise KvtierError(f"--direct must be auto, on or off, got {args.direct!r}")
    extra = {"sizes_bytes": _sizes(args.sizes)} if args.sizes else {}
    config = FsConfig(args.dir, threads=_positive_ints(_ints(args.threads, "threads"), "--threads"),
                      blocks=args.blocks, direct=args.direct, **extra)
    try:
        return run_fs(config, progress=_progress())
    except OSError as error:  # a read-only or full filesystem: what the probe could not write
        raise failure(f"--dir {args.dir}: cannot write the probe's files ({error.strerror or error}); "
                      "give a writable folder with room for them") from None


def _bytes(text: str) -> int:
    """One size; ``0`` allowed (no margin, no reserve)."""
    from kvtier.probes.active.stats import parse_sizes

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
    from kvtier.probes.active.headroom import HeadroomConfig, measure_headroom

    sizes = {}
    for flag, text in (("--margin-min", args.margin_min), ("--reserve", args.reserve)):
        try:
            sizes[flag] = _bytes(text)
        except ValueError as error:
            raise KvtierError(f"{flag}: {error}") from None
    config = HeadroomConfig(margin_fraction=args.margin_fraction, margin_min_bytes=sizes["--margin-min"],
                            reserve_bytes=sizes["--reserve"])
    block = _sizes_of(args.block_bytes, "--block-bytes")[0] if args.block_bytes else None
    return _WithBlocks(measure_headroom(config), block)


def _sizes_of(text: str, flag: str) -> tuple[int, ...]:
    try:
        return _sizes(text)
    except KvtierError as error:
        raise KvtierError(str(error).replace("--sizes", flag, 1)) from None


def _load(args):
    from kvtier.load import run_load_from_args

    if args.requests < 1:
        raise KvtierError(f"--requests must be >= 1, got {args.requests}")
    levels = _positive_ints(_ints(args.concurrency, "concurrency"), "--concurrency")
    return run_load_from_args(args, levels, _progress())


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
