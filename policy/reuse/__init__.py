"""The reuse analysis: the seed's four questions and the wrong-optimisation verdict.

``analyze(records, params, ...)`` runs one pass and returns a JSON-ready report;
``render(report)`` prints it for people.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvtier.collector.events import RequestRecord
from kvtier.policy.cost import CostParams
from kvtier.policy.recommend.values import encode
from kvtier.policy.reuse.collect import collect
from kvtier.policy.reuse.questions import (
    block_sizing,
    drop_candidates,
    reuse_timing,
    shared_prefixes,
)
from kvtier.policy.reuse.render import render
from kvtier.policy.reuse.stats import ReuseStats
from kvtier.policy.reuse.verdict import verdict

__all__ = ["ReuseStats", "analyze", "collect", "render", "report_from_stats"]


def analyze(records: Iterable[RequestRecord], params: CostParams = CostParams(), *,
            gpu_token_hit_ratio: float | None = None, ttft_slo_s: float | None = None,
            host_cap_bytes: int | None = None, top: int = 10, drop_below: float = 0.05) -> dict:
    """The reuse report of a trace (see :func:`report_from_stats`)."""
    return report_from_stats(collect(records), params, gpu_token_hit_ratio=gpu_token_hit_ratio,
                             ttft_slo_s=ttft_slo_s, host_cap_bytes=host_cap_bytes, top=top,
                             drop_below=drop_below)


def report_from_stats(stats: ReuseStats, params: CostParams = CostParams(), *,
                      gpu_token_hit_ratio: float | None = None, ttft_slo_s: float | None = None,
                      host_cap_bytes: int | None = None, top: int = 10,
                      drop_below: float = 0.05) -> dict:
    """A JSON-ready dict: trace totals, the four answers, and the verdict (its JSON form,
    :func:`kvtier.policy.recommend.values.encode` of :func:`kvtier.policy.reuse.verdict.verdict`)."""
    return {
        "trace": {"requests": stats.requests, "prompt_tokens": stats.prompt_tokens,
                  "block_refs": stats.block_refs, "duration_s": stats.duration_s,
                  "block_tokens": stats.block_tokens},
        "shared_prefixes": shared_prefixes(stats, top),
        "reuse_timing": reuse_timing(stats),
        "block_sizing": block_sizing(stats, params),
        "drop": drop_candidates(stats, drop_below),
        "offloading": encode(verdict(stats, params, gpu_token_hit_ratio=gpu_token_hit_ratio,
                                     ttft_slo_s=ttft_slo_s, host_cap_bytes=host_cap_bytes)),
    }
