"""`kvtier recommend --check RECOMMENDATION --store STORE`: did a pushed recommendation keep
its promises? Its predicted hit ratio and TTFT percentiles against what the engine measured
on the requests it served under the recommended tier configuration
(:mod:`kvtier.policy.recommend.promises`).

Exit 0: every promise held; 3: too few requests under that configuration yet (the line says
how many more); 4: a promise did not hold. The verdict is also written beside the
recommendation, as ``recommendation.check.json``, where the collector
(``--recommendation``) exports it and the dashboard shows it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvtier.collector import json_text
from kvtier.errors import KvtierError

HELD, TOO_FEW, BROKEN = 0, 3, 4


def add_arguments(parser) -> None:
    parser.add_argument("--check", metavar="RECOMMENDATION",
                        help="instead of recommending: compare the recommendation.json a push "
                             "applied with what --store measured on the requests under its "
                             "tier configuration (exit 0 every prediction held, 3 too few "
                             "requests yet, 4 one did not hold)")
    parser.add_argument("--min-requests", type=int,
                        help="--check: requests to wait for under the new configuration "
                             "(default: as many as the recommendation was made from)")
    parser.add_argument("--tolerance-points", type=float, default=2.0,
                        help="--check: the token hit ratio holds within this many percentage "
                             "points of the prediction (default 2)")
    parser.add_argument("--json", action="store_true", help="--check: print one JSON object")


def run_check(args) -> int:
    """The verb's glue: read the recommendation and the store, print the verdict."""
    from kvtier.collector.exports.recommendation import CHECK_FILE
    from kvtier.policy.recommend.promises import check_promises

    if not args.store:
        raise KvtierError("--check needs --store STORE (the store the engine records into)")
    rec, engine = _recommendation(args.check, args.engine)
    settings = rec.for_engine(engine) if engine else rec.settings
    config = args.tier_config or _tier_config(engine, settings, args.check)
    records = _records(args.store, config, args.instance)
    served = rec.evidence.served_tier_config
    before = _records(args.store, served, args.instance) if served and served != config else []
    try:
        result = check_promises(rec, engine, records, config, min_requests=args.min_requests,
                                tolerance_points=args.tolerance_points, served=before)
    except ValueError as error:
        raise KvtierError(str(error).replace("min_requests", "--min-requests")
                          .replace("tolerance_points", "--tolerance-points")) from None
    if args.json:
        print(json_text.dumps(_as_json(result)))
    else:
        _print(result, args.check)
    _keep(result, Path(args.check).with_name(CHECK_FILE), quiet=args.json)
    if not result.enough or result.held is None:
        return TOO_FEW
    return HELD if result.held else BROKEN


def _recommendation(path: str, engine_flag: str):
    """The recommendation, and the engine whose settings it is checked for: the file's own
    engine, else ``--engine``, else vLLM's when it holds vLLM's settings."""
    from kvtier.policy.recommend.recommendation import from_json

    try:
        doc = json.loads(Path(path).read_text())
        rec = from_json(doc)
    except OSError as error:
        raise KvtierError(f"--check {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise KvtierError(f"--check {path}: {error}; give the recommendation.json kvtier "
                          "recommend wrote") from None
    engine = doc.get("engine") or (engine_flag if engine_flag != "all" else None)
    if engine is None and rec.for_engine("vllm") is not None:
        engine = "vllm"
    if engine is not None and rec.for_engine(engine) is None:
        raise KvtierError(f"--check {path}: no settings for engine {engine}; give the "
                          "recommendation written for it")
    return rec, engine


def _tier_config(engine: str | None, settings, path: str) -> str:
    """The tier configuration kvtier's vLLM connector stamps on the requests of an engine
    running ``settings`` (what ``kvtier push`` writes, read as the connector reads it)."""
    if engine != "vllm":
        raise KvtierError(f"--check {path}: give --tier-config (the tier_config_id the "
                          f"{engine or 'engine'}'s requests carry under the new settings); "
                          "only kvtier's vLLM connector derives it from the settings")
    from kvtier.policy.writers.vllm import transfer_config
    from kvtier.probes.vllm.hook_settings import offload_tier_config

    extra = transfer_config(settings)["kv_connector_extra_config"]
    return offload_tier_config(extra)


def _records(store: str, config: str, instance: str | None) -> list:
    from kvtier.policy.readers import open_trace

    if not Path(store).exists():
        raise KvtierError(f"--store {store}: no such file or folder")
    reader = open_trace(store, "store", instance=instance, tier_config_id=config)
    records = list(reader.requests())
    if getattr(reader, "note", None):  # a locked store read through its segments
        print(f"kvtier recommend: note: {reader.note}; {_export_words(reader.root, len(records), config)}",
              file=sys.stderr, flush=True)
    return records


def _export_words(segments: Path, read: int, config: str) -> str:
    """How many requests the segments gave and how old their last export is: what the
    running collector stored since is not read yet."""
    import time

    files = [f for f in Path(segments).rglob("*.parquet") if f.is_file()]
    if not files:
        return f"{read} requests under {config} read; no segment exported yet"
    age = max(0.0, time.time() - max(f.stat().st_mtime for f in files))
    return (f"{read} requests under {config} read from segments last exported {age:.0f} s ago; "
            "what the collector stored since is not read yet: check again after its next "
            "export (kvtier collect --export-every-s)")


def _keep(result, path: Path, quiet: bool) -> None:
    """The verdict beside the recommendation, replaced in one rename; a folder that cannot
    be written is said, not fatal (the verdict was printed)."""
    import os

    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        json_text.write(partial, _as_json(result))
        os.replace(partial, path)
    except OSError as error:
        print(f"kvtier recommend: note: {path} not written: {error.strerror or error}",
              file=sys.stderr)
        return
    if not quiet:
        print(f"wrote {path}")


def _as_json(result) -> dict:
    from kvtier.policy.recommend.promises import improvement_words

    return {"tier_config": result.tier_config, "requests": result.requests,
            "served_tier_config": result.served_tier_config,
            "improvement": improvement_words(result),
            "needed": result.needed, "more_needed": result.more_needed,
            "warmup": result.warmup, "basis": result.basis, "held": result.held,
            "promises": [{"metric": p.metric, "predicted": p.predicted, "low": p.low,
                          "high": p.high, "measured": p.measured, "held": p.held}
                         for p in result.promises]}


def _print(result, path: str) -> None:
    print(f"{path}: predicted for {result.basis}; requests under {result.tier_config}: "
          f"{result.requests}")
    if not result.enough:
        print(f"needs {result.more_needed} more requests under {result.tier_config} "
              f"({result.requests} of {result.needed}); check again later")
    else:
        print(f"judged the last {result.judged} (the first {result.warmup} warm the tiers, "
              "as in the prediction)")
    print(f"  {'metric':<16} {'predicted':>10}  {'interval':<22} {'measured':>10}")
    for p in result.promises:
        measured = "-" if p.measured is None else f"{p.measured:.4g}"
        state = {True: "held", False: "OUTSIDE", None: ""}[p.held if result.enough else None]
        print(f"  {p.metric:<16} {p.predicted:>10.4g}  [{p.low:.4g}, {p.high:.4g}]"
              f"{'':<{max(0, 20 - len(f'{p.low:.4g}, {p.high:.4g}'))}} {measured:>10}  {state}")
    from kvtier.policy.recommend.promises import improvement_words

    if result.served_tier_config:
        print(f"  (a change is the new configuration less {result.served_tier_config}, the same "
              "later share of each)")
    if result.enough and improvement_words(result):
        print(f"NOT MATERIALISED: {improvement_words(result)}")
    if result.enough:
        missed = [p.metric for p in result.promises if p.held is False]
        print("verdict: every prediction held" if result.held else
              f"verdict: not held: {', '.join(missed)} outside the predicted interval"
              if missed else "verdict: nothing measured to judge")
