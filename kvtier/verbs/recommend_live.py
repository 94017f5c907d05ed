"""`kvtier recommend --live-curves`: the collector's live curve of the instance, printed as
the starting point beside the recommendation (what the tiers would serve at each size now,
and the CPU size for a share of the hits one adds)."""

from pathlib import Path

from kvtier.errors import KvtierError

GIB = 1 << 30


def add_live_curves_argument(parser) -> None:
    parser.add_argument("--live-curves", metavar="PATH",
                        help="the live curves kvtier collect --live-curves writes (a segment "
                             "folder, its live_curves/ or one file): each instance's is printed "
                             "as the starting point beside its recommendation")


def print_live_start(args, instances: tuple[str, ...]) -> None:
    """The live curve of each instance recommended for (``args.instance``, the fleet's
    ``instances``, or the file's only one); ``KvtierError`` for a file that is not one."""
    if not getattr(args, "live_curves", None):
        return
    from kvtier.policy.livecurve.curve_values import curve_of, read_live_curves

    try:
        curves = read_live_curves(Path(args.live_curves))
    except FileNotFoundError:
        raise KvtierError(f"--live-curves {args.live_curves}: no live curve file there (kvtier "
                          "collect --live-curves writes SEGMENTS/live_curves/)") from None
    except ValueError as error:
        raise KvtierError(f"--live-curves: {error}") from None
    for name in instances or (args.instance,):
        curve = curve_of(curves, name, args.source_engine)
        print("\n".join(live_lines(curve)) if curve is not None else
              f"live curve: none for instance {name or '(the trace)'} in {args.live_curves}")


def live_lines(curve) -> list[str]:
    window = curve.window("all")
    cpu = [p for p in window.points if p.tier == "cpu"]
    sizes = ", ".join(f"{p.size_bytes / GIB:.1f} GiB {p.hit_ratio:.1%}" for p in cpu if p.size_tokens)
    reach = {r.percent: r.size_bytes / GIB for r in window.reach}
    return [f"live curve of {curve.engine}/{curve.instance} ({window.requests:,} requests since "
            f"the collector started, {curve.semantics} tiers, GPU {curve.gpu_tokens:,} tokens "
            f"{curve.gpu_source}, KV bytes {curve.kv_bytes_source}): GPU alone "
            f"{window.gpu_hit_ratio:.1%}; with a CPU tier of {sizes}",
            f"  a CPU tier of {reach.get(90, 0):.1f} GiB serves 90% of the hits one of "
            f"{cpu[-1].size_bytes / GIB:.1f} GiB adds (95%: {reach.get(95, 0):.1f} GiB, "
            f"99%: {reach.get(99, 0):.1f} GiB)"]
