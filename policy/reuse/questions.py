"""The seed's four reuse questions, answered from :class:`ReuseStats`.

1. Which prefixes are shared (top prefixes by the prompt tokens their reuse saves)?
2. How long after creation are they reused (distributions, by request type)?
3. How big is a useful block against the host transfer budget (bytes per block for a model,
   transfer versus recompute time, the break-even block size, the link load reuse implies)?
4. Which blocks should be dropped at once (never or rarely reused, by depth and type)?
"""

from __future__ import annotations

from collections import defaultdict

from kvtier.policy.cost import CostParams
from kvtier.policy.reuse.stats import ALL, ReuseStats
from kvtier.policy.reuse.histogram import LogHistogram

DEPTH_BUCKETS = ((0, 0), (1, 3), (4, 15), (16, 63), (64, 255), (256, None))
REUSE_WINDOWS_S = (10.0, 60.0, 600.0, 3600.0)


def shared_prefixes(stats: ReuseStats, top: int = 10) -> dict:
    """Maximal shared prefixes (a reused block none of whose children is reused as often),
    ranked by the prompt tokens an unlimited cache would save on their reuses."""
    deeper_equal = set()
    for block in stats.blocks.values():
        parent = stats.blocks.get(block.parent) if block.parent is not None else None
        if parent is not None and parent.refs == block.refs:
            deeper_equal.add(block.parent)
    size = stats.block_tokens or 1
    ranked = []
    for h, block in stats.blocks.items():
        if block.refs > 1 and h not in deeper_equal:
            prefix_tokens = block.depth * size + block.tokens
            ranked.append({"block_hash": h, "prefix_tokens": prefix_tokens, "uses": block.refs,
                           "saved_tokens": (block.refs - 1) * prefix_tokens,
                           "first_seen_s": block.first_s, "last_used_s": block.last_s})
    ranked.sort(key=lambda row: row["saved_tokens"], reverse=True)
    once = sum(1 for b in stats.blocks.values() if b.refs == 1)
    return {"distinct_blocks": len(stats.blocks), "blocks_used_once": once,
            "blocks_used_once_fraction": once / len(stats.blocks) if stats.blocks else 0.0,
            "ideal_token_hit_ratio": stats.ideal_token_hit_ratio,
            "shared_prefixes": len(ranked), "top": ranked[:top]}


def reuse_timing(stats: ReuseStats) -> dict:
    """Time from creation and from the previous use to each reuse, overall, by request type
    and by conversation turn (where the trace has them)."""
    overall_creation, overall_last = _merged(stats.since_creation), _merged(stats.since_last_use)
    by_type = {kind: {"since_creation": h.summary(),
                      "since_last_use": stats.since_last_use[kind].summary()}
               for kind, h in sorted(stats.since_creation.items()) if kind != ALL}
    by_turn = {bucket: h.summary() for bucket, h in stats.since_last_use_by_turn.items()}
    return {"since_creation": overall_creation.summary(),
            "since_last_use": overall_last.summary(),
            "since_last_use_by_turn": by_turn,
            "reused_within": {f"{int(w)}s": overall_last.fraction_at_most(w)
                              for w in REUSE_WINDOWS_S},
            "by_type": by_type}


def block_sizing(stats: ReuseStats, params: CostParams) -> dict:
    """Bytes and seconds per block for the model, the break-even block size per tier path,
    and the host link load if every ideal reuse were promoted from CPU."""
    block_tokens = stats.block_tokens or 16
    bpt = params.model.bytes_per_token
    paths = {}
    for path in ("cpu", "cold"):
        move_s = params.promotion_s(block_tokens, path)
        recompute_s = params.recompute_s(block_tokens)
        paths[path] = {"transfer_s_per_block": move_s, "recompute_s_per_block": recompute_s,
                       "transfer_wins": move_s < recompute_s,
                       "break_even_block_tokens": _break_even_tokens(params, path)}
    reuse_tokens_per_s = stats.ideal_hit_tokens / stats.duration_s if stats.duration_s else None
    link_load = None
    if reuse_tokens_per_s is not None:
        link_load = reuse_tokens_per_s * bpt / params.cpu_gpu_bandwidth_bytes_per_s.value
    return {"model": params.model.name, "geometry_source": params.model.source,
            "bytes_per_token": bpt, "block_tokens": block_tokens,
            "bytes_per_block": bpt * block_tokens, "paths": paths,
            "reused_tokens_per_s": reuse_tokens_per_s, "host_link_load": link_load,
            "parameter_sources": params.sources()}


def _break_even_tokens(params: CostParams, path: str) -> float | None:
    """Smallest block (tokens) whose promotion beats its recompute; ``None`` if none does."""
    fixed = params.cpu_gpu_op_latency_s.value
    per_token = params.model.bytes_per_token / params.cpu_gpu_bandwidth_bytes_per_s.value
    if path == "cold":
        fixed += params.cold_cpu_op_latency_s.value
        per_token += params.model.bytes_per_token / params.cold_cpu_bandwidth_bytes_per_s.value
    margin = 1.0 / params.prefill_tokens_per_s.value - per_token
    return fixed / margin if margin > 0 else None


def drop_candidates(stats: ReuseStats, drop_below: float = 0.05) -> dict:
    """Reuse probability (share of created blocks used again) by depth bucket and by type;
    buckets under ``drop_below`` are blocks to drop at once rather than offload."""
    by_depth, by_type = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    for block in stats.blocks.values():
        reused = block.refs > 1
        for table, key in ((by_depth, _depth_bucket(block.depth)), (by_type, block.request_type)):
            table[key][0] += 1
            table[key][1] += reused
    depth_rows = [_row(label, *by_depth[label]) for label in (_label(b) for b in DEPTH_BUCKETS)
                  if label in by_depth]
    type_rows = [_row(kind, *counts) for kind, counts in sorted(by_type.items())]
    drop = [row["bucket"] for row in depth_rows if row["reuse_probability"] < drop_below]
    return {"drop_below": drop_below, "by_depth": depth_rows, "by_type": type_rows,
            "drop_depths": drop}


def _row(label: str, created: int, reused: int) -> dict:
    return {"bucket": label, "blocks": created, "reused": reused,
            "reuse_probability": reused / created if created else 0.0}


def _depth_bucket(depth: int) -> str:
    for bucket in DEPTH_BUCKETS:
        low, high = bucket
        if depth >= low and (high is None or depth <= high):
            return _label(bucket)
    raise ValueError(f"depth must be >= 0, got {depth}")


def _label(bucket: tuple[int, int | None]) -> str:
    low, high = bucket
    return f"{low}+" if high is None else (f"{low}" if low == high else f"{low}-{high}")


def _merged(by_type: dict[str, LogHistogram]) -> LogHistogram:
    merged = LogHistogram()
    for histogram in by_type.values():
        merged.merge(histogram)
    return merged
