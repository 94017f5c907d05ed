"""``kvtier recommend``: read, recommend with progress, write the report and configs."""

from __future__ import annotations

from pathlib import Path

from kvtier.errors import KvtierError
from kvtier.progress import task
from policy.commands.common import capacity_blocks, model_geometry, open_records
from policy.cost import CostParams
from policy.learn.subset import limited
from policy.recommend import report
from policy.recommend.build import Inputs, recommend
from policy.recommend.headroom import HostLimit, from_bytes, from_probe_json
from policy.writers import ENGINES

PHASES = 4


def run(args) -> int:
    if bool(args.trace) == bool(args.store):
        raise KvtierError("give exactly one of --trace PATH or --store DB")
    args.trace = args.trace or args.store
    if args.store:
        args.format = "store"
    _, records = open_records(args)
    records = list(limited(records, args.max_requests, args.coarsen))
    if len(records) < 40:
        raise KvtierError(f"{args.trace}: {len(records)} requests; a recommendation needs "
                          "at least 40 (half to train, half to measure)")
    model = model_geometry(args.model)
    block_tokens = records[0].block_size_tokens or 16
    gpu = capacity_blocks(args.gpu_tokens, block_tokens, model, "--gpu-tokens")
    cpu = capacity_blocks(args.cpu_tokens, block_tokens, model, "--cpu-tokens")
    if not gpu or not cpu:
        raise KvtierError("--gpu-tokens and --cpu-tokens must be finite and hold at least "
                          f"one {block_tokens}-token block")
    try:
        inputs = Inputs(gpu, cpu, args.train_fraction, args.seed, args.prefill_servers,
                        host=_host_limit(args))
    except ValueError as error:
        raise KvtierError(str(error)) from None
    with task("recommending", total=PHASES) as advance:
        rec = recommend(records, inputs, CostParams(model=model), step=lambda name: advance())
    engines = ENGINES if args.engine == "all" else (args.engine,)
    written = report.write(rec, Path(args.out), engines)
    print(f"verdict: {rec.verdict.replace('_', ' ')}")
    for knob in rec.knobs:
        print(f"  {knob.name} = {knob.value}")
    print(f"wrote {len(written)} files to {args.out} (report.md, recommendation.json, configs)")
    return 0


def _host_limit(args) -> HostLimit | None:
    if getattr(args, "headroom_json", None):
        return from_probe_json(args.headroom_json)
    if getattr(args, "host_headroom_bytes", None) is not None:
        return from_bytes(args.host_headroom_bytes)
    return None
