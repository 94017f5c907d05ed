"""An instance's counts turned into the values it exports: per window, the hit ratio at each
ladder size, the CPU sizes for a share of the reachable hits, the prefill the next GiB saves;
and the headroom signal over its latest requests."""

from __future__ import annotations

import numpy as np

from kvtier.policy.cost import CostParams
from kvtier.policy.livecurve.config import REACHABLE_PERCENTS
from kvtier.policy.livecurve.curve_values import (ALL, CurvePoint, InstanceCurves, Reach,
                                                  WindowCurve)
from kvtier.policy.livecurve.instance_curve import Counts, InstanceCurve
from kvtier.policy.livecurve.load_headroom import headroom, saved_s_per_token

GIB = 1 << 30


def instance_values(curve: InstanceCurve, counts: list[tuple[Counts, float]],
                    windows: list[float | None], recent: np.ndarray, memory_bytes: int,
                    priced: tuple[CostParams, str, int, str], gpu_source: str) -> InstanceCurves:
    """The values of ``curve`` from its ``counts`` per window (``None``: since start) and its
    ``recent`` requests; ``priced`` is (cost model, its source, KV bytes per token, theirs)."""
    params, costs, per_token, kv_source = priced
    shown = [window_curve(curve, c, span, ALL if w is None else f"{w:g}s", params, costs, per_token)
             for (c, span), w in zip(counts, windows)]
    budget = curve.config.ttft_budget_s
    room = None
    if budget is not None and len(recent):
        shortest = min(curve.config.windows_s)
        room = headroom(recent[recent[:, 0] >= recent[-1, 0] - shortest], params, costs, budget)
    return InstanceCurves(curve.engine, curve.instance, curve.semantics, curve.gpu_tokens,
                          gpu_source, curve.block_tokens, per_token, kv_source,
                          curve.kernel.tracked_blocks, memory_bytes, tuple(shown), room)


def window_curve(curve: InstanceCurve, counts: Counts, span_s: float, name: str,
                 params: CostParams, costs: str, per_token: int) -> WindowCurve:
    prompt = int(counts.totals[1])
    bt = curve.block_tokens
    points = _ladder(curve, counts, "cpu", curve.config.cpu_ladder_tokens, curve.cpu_blocks,
                     None, span_s, params, costs, per_token)
    if curve.cold_blocks:
        below = (curve.config.cold_above_cpu_tokens,
                 curve.served_tokens(counts, "cpu", curve.cold_above_blocks))
        points += _ladder(curve, counts, "cold", curve.config.cold_ladder_tokens,
                          curve.cold_blocks, below, span_s, params, costs, per_token)
    reach, reachable = [], 0
    for percent in REACHABLE_PERCENTS:
        blocks, reachable = curve.reach_blocks(counts, percent / 100)
        reach.append(Reach(percent, blocks * bt, blocks * bt * per_token))
    gpu = curve.served_tokens(counts, "cpu", 0)
    return WindowCurve(name, float(span_s), int(counts.totals[0]), prompt,
                       gpu / prompt if prompt else 0.0, tuple(points), tuple(reach), reachable)


def _ladder(curve, counts, tier, sizes_tokens, sizes_blocks, below, span_s, params, costs,
            per_token) -> list[CurvePoint]:
    """``tier``'s points; each one's gain is against the size below it (``below``: the
    (tokens, served) before the first size; the first CPU size has none)."""
    prompt = int(counts.totals[1])
    path = "cold" if tier == "cold" else "cpu"
    saving = saved_s_per_token(params, curve.block_tokens, path) if costs != "default" else None
    out = []
    for tokens, blocks in zip(sizes_tokens, sizes_blocks):
        served = curve.served_tokens(counts, tier, blocks)
        gain = None
        if saving is not None and below is not None and tokens > below[0]:
            gib = (tokens - below[0]) * per_token / GIB
            gain = (served - below[1]) / span_s * saving / gib
        out.append(CurvePoint(tier, int(tokens), int(tokens) * per_token,
                              served / prompt if prompt else 0.0, served, gain))
        below = (tokens, served)
    return out
