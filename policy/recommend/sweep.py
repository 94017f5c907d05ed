"""Sweep the offload threshold over learned priorities in the simulator.

Each candidate ``min_priority`` is replayed with TensorRT-LLM's offload gate over the
learned priority of every GPU victim: ``"ge"`` offloads priority >= threshold (as coded),
``"gt"`` priority > threshold (as documented). Both are swept, so the report shows what the
doc/code mismatch would cost; the setting handed to the writers means ">= threshold" and the
TRT-LLM writer places it where both rules agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.replay import IndexedAdmitter, Tiers, replay
from kvtier.policy.recommend.values import SweepPoint
from kvtier.policy.sim.policies.admission import COMPARISONS

THRESHOLDS = (0, 10, 20, 30, 40, 50, 60, 70)


def priority_scores(priority_by_offer: dict, comparison: str) -> dict:
    """Scores for :class:`IndexedAdmitter` so that ``score >= t`` means the gate passes:
    under ``"gt"`` a priority ``p`` passes ``t`` only if ``p > t``, i.e. ``p - 0.5 >= t``."""
    if comparison not in COMPARISONS:
        raise ValueError(f"comparison must be one of {', '.join(COMPARISONS)}, "
                         f"got {comparison!r}")
    shift = 0.0 if comparison == "ge" else 0.5
    return {key: p - shift for key, p in priority_by_offer.items()}


def sweep(records: Sequence[RequestRecord], tiers: Tiers, priority_by_offer: dict,
          count_from: int, thresholds: Sequence[int] = THRESHOLDS,
          comparisons: Sequence[str] = COMPARISONS) -> list[SweepPoint]:
    """A point per (threshold, comparison), counted from ``count_from``. When every
    priority and threshold is a multiple of one step, ``p > t`` selects what ``p >= t +
    step`` selects, so a ``"gt"`` point is the ``"ge"`` point one step up, not a replay."""
    step = _common_step(priority_by_offer.values(), thresholds)
    points = {}
    for comparison in comparisons:
        scores = priority_scores(priority_by_offer, comparison)
        for threshold in thresholds:
            shifted = (threshold + step, "ge") if step and comparison == "gt" else None
            if shifted in points:
                same = points[shifted]
                points[(threshold, comparison)] = SweepPoint(
                    int(threshold), comparison, same.token_hit_ratio, same.recompute_tokens,
                    same.cpu_stores_total)
                continue
            admitter = IndexedAdmitter(scores, threshold - 1e-9)
            result = replay(records, tiers, "lru", admitter=admitter,
                            count_from=count_from).result
            points[(threshold, comparison)] = SweepPoint(
                int(threshold), comparison, result.token_hit_ratio, result.recompute_tokens,
                result.cpu_stores_total)
    return list(points.values())


def _common_step(priorities, thresholds) -> int | None:
    values = set(priorities) | set(thresholds)
    for step in (10, 5, 2):
        if all(v % step == 0 for v in values):
            return step
    return None


def best(points: Sequence[SweepPoint], comparison: str = "ge") -> SweepPoint:
    """The threshold with the fewest recomputed tokens (ties: the higher threshold, which
    writes less to the host)."""
    mine = [p for p in points if p.comparison == comparison]
    if not mine:
        raise ValueError(f"no sweep points for comparison {comparison!r}")
    return min(mine, key=lambda p: (p.recompute_tokens, -p.min_priority))
