"""``kvtier probe`` behind the verb module: build configs from flags, run, print, save."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvtier.errors import KvtierError
from probes.active.stats import parse_sizes


def run_probe(args) -> int:
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
    from probes.active.transfer import DEFAULT_SIZES, TransferConfig, run_transfer

    if args.torch_threads is not None:
        import torch

        if args.torch_threads < 1:
            raise ValueError(f"--torch-threads must be >= 1, got {args.torch_threads}")
        torch.set_num_threads(args.torch_threads)
    sizes = parse_sizes(args.sizes) if args.sizes else DEFAULT_SIZES
    return run_transfer(TransferConfig(sizes, repeats=args.repeats), progress=_progress())


def _fs(args):
    from probes.active.fs import FsConfig, run_fs

    if not Path(args.dir).is_dir():
        raise KvtierError(f"--dir {args.dir!r} is not a folder")
    extra = {"sizes_bytes": parse_sizes(args.sizes)} if args.sizes else {}
    return run_fs(FsConfig(args.dir, threads=_ints(args.threads, "threads"), blocks=args.blocks,
                           direct=args.direct, **extra), progress=_progress())


def _bytes(text: str) -> int:
    """One size; ``0`` allowed (no margin, no reserve)."""
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
    from probes.active.headroom import HeadroomConfig, measure_headroom

    config = HeadroomConfig(margin_fraction=args.margin_fraction, margin_min_bytes=_bytes(args.margin_min),
                            reserve_bytes=_bytes(args.reserve))
    block = parse_sizes(args.block_bytes)[0] if args.block_bytes else None
    return _WithBlocks(measure_headroom(config), block)


def _load(args):
    from probes.active.load_command import run_load_from_args

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
