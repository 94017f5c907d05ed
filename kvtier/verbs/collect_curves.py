"""`kvtier collect`'s live what-if curves: their flags, and the observer they build. Standard
library only at import: this runs while ``kvtier --help`` builds its parser."""

from kvtier.errors import KvtierError


def add_curve_arguments(parser) -> None:
    group = parser.add_argument_group(
        "live what-if curves", "each instance's token hit ratio at a ladder of tier sizes, kept "
        "at ingest under the engine's tier semantics (README: Live sizing)")
    group.add_argument("--live-curves", action="store_true",
                       help="keep the curves and the headroom signal (kvtier_live_*, "
                            "kvtier_headroom_*; SEGMENTS/live_curves/ for the dashboard and "
                            "recommend --live-curves)")
    group.add_argument("--curve-gpu-tokens", action="append", default=[], metavar="[NAME=]TOKENS",
                       help="the GPU prefix cache of every instance, or of instance NAME "
                            "(repeatable); vLLM's own, when --scrape reads it, otherwise")
    group.add_argument("--curve-cpu-tokens", metavar="LIST",
                       help="CPU-tier sizes to report, e.g. 0,256k,1M,4M (default "
                            "0,64k,128k,...,4M; 0: the GPU alone)")
    group.add_argument("--curve-cold-tokens", metavar="LIST",
                       help="file-tier sizes to report under --curve-cold-above-cpu-tokens")
    group.add_argument("--curve-cold-above-cpu-tokens", metavar="TOKENS",
                       help="the CPU-tier size the file-tier ladder sits under")
    group.add_argument("--curve-windows-s", metavar="LIST", default="300,3600",
                       help="sliding windows in seconds (default 300,3600; 'all' is always kept)")
    group.add_argument("--curve-kv-bytes-per-token", type=int, metavar="BYTES",
                       help="KV bytes per token for the byte sizes when an instance's block "
                            "events carry none")
    group.add_argument("--cost-params", metavar="FILE",
                       help="kvtier calibrate --out: prices the prefill each GiB saves and the "
                            "headroom (kvtier's default costs otherwise, and the series say so)")


def curve_observers(args, collector: str) -> tuple:
    """The observers ``--live-curves`` asks for (none without it); ``KvtierError`` naming a
    bad flag."""
    if not args.live_curves:
        for flag in ("curve_cpu_tokens", "curve_cold_tokens", "curve_cold_above_cpu_tokens",
                     "cost_params"):
            if getattr(args, flag):
                raise KvtierError(f"--{flag.replace('_', '-')} needs --live-curves")
        return ()
    from pathlib import Path

    from kvtier.policy.livecurve.config import CurveConfig
    from kvtier.policy.livecurve.live_curves import LiveCurves

    if args.cost_params and not Path(args.cost_params).is_file():
        raise KvtierError(f"--cost-params {args.cost_params}: no such file; give the file "
                          "kvtier calibrate --out wrote")
    try:
        config = CurveConfig(**_ladders(args), **_gpu(args.curve_gpu_tokens),
                             kv_bytes_per_token=args.curve_kv_bytes_per_token,
                             windows_s=tuple(_numbers(args.curve_windows_s, "--curve-windows-s")),
                             ttft_budget_s=args.ttft_p99_budget_s)
        return (LiveCurves(config, collector=collector,
                           cost_file=Path(args.cost_params) if args.cost_params else None),)
    except ValueError as error:
        raise KvtierError(f"--live-curves: {error}") from None


def _ladders(args) -> dict:
    found = {}
    if args.curve_cpu_tokens:
        found["cpu_ladder_tokens"] = _tokens_list(args.curve_cpu_tokens, "--curve-cpu-tokens")
    if args.curve_cold_tokens:
        found["cold_ladder_tokens"] = _tokens_list(args.curve_cold_tokens, "--curve-cold-tokens")
    if args.curve_cold_above_cpu_tokens:
        found["cold_above_cpu_tokens"] = _tokens(args.curve_cold_above_cpu_tokens,
                                                 "--curve-cold-above-cpu-tokens")
    return found


def _gpu(values: list[str]) -> dict:
    everyone, named = None, []
    for value in values:
        name, _, tokens = value.rpartition("=")
        if name:
            named.append((name, _tokens(tokens, "--curve-gpu-tokens")))
        else:
            everyone = _tokens(tokens, "--curve-gpu-tokens")
    return {"gpu_tokens": everyone, "gpu_tokens_by_instance": tuple(named)}


def _tokens(text: str, flag: str) -> int:
    from math import isinf

    from kvtier.policy.geometry import parse_capacity_tokens

    try:
        value = parse_capacity_tokens(text)
    except ValueError as error:
        raise KvtierError(f"{flag}: {error}") from None
    if isinf(value):
        raise KvtierError(f"{flag}: give a size in tokens (e.g. 256k), not {text!r}")
    return int(value)


def _tokens_list(text: str, flag: str) -> tuple[int, ...]:
    return tuple(_tokens(part, flag) for part in text.split(",") if part.strip())


def _numbers(text: str, flag: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise KvtierError(f"{flag}: give seconds separated by commas, e.g. 300,3600; got "
                          f"{text!r}") from None
