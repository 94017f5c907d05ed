"""Tier sizes from the one-pass LRU curve and the cost model: the knee, capped by measurement.

A tier stacked above ``offset_blocks`` of faster cache (the CPU tier above the GPU, the cold
tier above both; exclusive tiers, as in kvtier's reference engine and the simulator's
default semantics) serves, at ``c`` blocks, what LRU with ``offset + c`` blocks serves beyond
LRU with ``offset``; :func:`kvtier.policy.curves.lru_curve` gives that at every capacity in one pass
(a test checks it against the simulator's replay). Each prompt token the tier serves saves
``saved_s_per_token`` = recompute - promotion (:mod:`kvtier.policy.cost`, measured where a probe or
the store measured it). The gain of the next GiB at size ``c`` is that saving times the
tokens the GiB adds, per second of the records' span: the share of one prefill server's
time it frees. The **knee** is the smallest size beyond which no further GiB frees
``threshold_per_gib`` (so a later rise of the curve is not missed); the size is the knee,
capped by the measured capacity (host headroom; the cold path's free space). Nothing is
sized to the free space itself: that is only ever a cap.
"""

from __future__ import annotations

import shutil

import numpy as np

from kvtier.policy.curves import HitRatioCurve
from kvtier.policy.recommend.values import CurvePoint, TierSize

GIB = 1 << 30
# The next GiB must free at least 0.1% of one prefill server's time: a GiB of host DRAM costs
# about a thousandth of a GPU (an assumption; --min-gain-per-gib changes it).
DEFAULT_MIN_GAIN_PER_GIB = 0.001
COLD_FREE_MARGIN_FRACTION, COLD_FREE_MARGIN_MIN_BYTES = 0.10, 1 << 30
CURVE_POINTS = 40
TIERS = ("cpu", "cold")


def tier_size(curve: HitRatioCurve, *, tier: str, offset_blocks: int, block_bytes: int,
              saved_s_per_token: float, span_s: float,
              threshold_per_gib: float = DEFAULT_MIN_GAIN_PER_GIB,
              cap_bytes: int | None = None, cap_source: str = "not checked",
              given_blocks: int | None = None) -> TierSize:
    """The size of ``tier`` above ``offset_blocks`` (see the module docstring);
    ``given_blocks`` fixes the size instead of the knee (still capped, still reported)."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
    if block_bytes < 1 or offset_blocks < 0 or not threshold_per_gib > 0:
        raise ValueError(f"need block_bytes >= 1, offset_blocks >= 0, threshold_per_gib > 0; got "
                         f"{block_bytes}, {offset_blocks}, {threshold_per_gib}")
    window = max(1, GIB // block_bytes)  # blocks in the next GiB
    rate = max(saved_s_per_token, 0.0) / max(span_s, 1.0)  # server share per token per second

    cumulative = np.concatenate([[0], curve.hit_tokens]).astype(np.int64)

    def hits(capacity):
        return cumulative[np.searchsorted(curve.capacities_blocks, capacity, side="right")]

    def gain(size):
        size = np.asarray(size, dtype=np.int64)
        return rate * (hits(offset_blocks + size + window) - hits(offset_blocks + size))

    steps = curve.capacities_blocks[curve.capacities_blocks > offset_blocks] - offset_blocks
    # the gain changes where a step enters the next GiB's window, and where it leaves it
    edges = steps - window
    candidates = np.unique(np.concatenate([[0], steps, edges[edges > 0]])).astype(np.int64)
    gains = gain(candidates)
    worth = np.flatnonzero(gains >= threshold_per_gib)
    # past the last size whose next GiB pays, the next change is a step leaving the window:
    # the knee takes that step, and no GiB beyond it pays
    knee = int(candidates[worth[-1] + 1]) if len(worth) else 0
    cap_blocks = None if cap_bytes is None else max(cap_bytes, 0) // block_bytes
    wanted = knee if given_blocks is None else given_blocks
    chosen = wanted if cap_blocks is None else min(wanted, cap_blocks)
    prompt = max(curve.prompt_tokens, 1)
    at_chosen = float(gain(chosen))
    reason = _reason(tier, knee, wanted, cap_blocks, cap_source, block_bytes, threshold_per_gib,
                     float(gain(knee)), float(gains.max()) if len(gains) else 0.0,
                     saved_s_per_token)
    if given_blocks is not None:
        reason = f"given: {human_bytes(given_blocks * block_bytes)} ({reason})"
    plateau = int(steps.max()) if len(steps) else 0
    return TierSize(
        tier=tier, block_bytes=block_bytes, knee_bytes=knee * block_bytes,
        wanted_bytes=wanted * block_bytes, chosen_bytes=chosen * block_bytes, cap_source=cap_source,
        threshold_per_gib=threshold_per_gib, gain_per_gib_at_chosen=at_chosen,
        saved_s_per_token=saved_s_per_token,
        token_hit_ratio_without=float(hits(offset_blocks)) / prompt,
        token_hit_ratio_at_chosen=float(hits(offset_blocks + chosen)) / prompt,
        reason=reason, cap_bytes=None if cap_blocks is None else cap_blocks * block_bytes,
        curve=_points(hits, gain, knee, chosen, plateau, block_bytes, prompt, offset_blocks))


def cold_free_cap(path: str) -> tuple[int, str]:
    """The cold tier's cap: free space of the file system holding ``path`` (its nearest
    existing parent) less max(10%, 1 GiB); the text says where the figure came from."""
    from pathlib import Path

    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    margin = max(int(free * COLD_FREE_MARGIN_FRACTION), COLD_FREE_MARGIN_MIN_BYTES)
    return max(free - margin, 0), (f"free space of {where} ({human_bytes(free)}) less a margin "
                                   f"of max({COLD_FREE_MARGIN_FRACTION:.0%}, 1 GiB)")


def human_bytes(size: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"


def _points(hits, gain, knee: int, chosen: int, plateau: int, block_bytes: int, prompt: int,
            offset: int) -> tuple[CurvePoint, ...]:
    """The curve from no tier to a bit past the knee (or the plateau), knee and size included."""
    end = max(knee, chosen, 1) * 2 if knee else max(plateau, 1)
    end = max(min(end, max(plateau, knee, chosen) + max(knee, 1) // 4), chosen, knee, 1)
    sizes = np.unique(np.concatenate([np.linspace(0, end, CURVE_POINTS).astype(np.int64),
                                      [knee, chosen]]))
    return tuple(CurvePoint(int(s) * block_bytes, float(hits(offset + s)) / prompt, float(gain(s)))
                 for s in sizes)


def _reason(tier: str, knee: int, wanted: int, cap_blocks: int | None, cap_source: str,
            block_bytes: int, threshold: float, at_knee: float, best: float,
            saved_s_per_token: float) -> str:
    name = "CPU" if tier == "cpu" else "cold"
    if saved_s_per_token <= 0:
        return (f"no {name} tier: a promotion from it costs at least as much as recomputing "
                f"(saves {saved_s_per_token * 1e6:.3g} us per token)")
    if not knee:
        return (f"no {name} tier: no GiB of it frees {threshold:.2%} of a prefill server's time "
                f"(the best frees {best:.3%})")
    text = (f"the knee of the LRU curve: past {human_bytes(knee * block_bytes)} the next GiB "
            f"frees less than {threshold:.2%} of a prefill server's time ({at_knee:.3%} there)")
    if cap_blocks is None:
        return f"{text}; not capped ({cap_source})"
    if cap_blocks < wanted:
        return f"{text}; capped at {human_bytes(cap_blocks * block_bytes)} ({cap_source})"
    return f"{text}; within the cap of {human_bytes(cap_blocks * block_bytes)} ({cap_source})"
