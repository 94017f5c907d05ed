"""Is offloading the wrong optimisation for this traffic? The seed's reasons, each checked.

Each reason is ``holds`` (True: a reason not to offload), ``False`` (checked, does not hold)
or ``None`` (a trace cannot tell; the note says what would). The verdict is
``"wrong_optimisation"`` when any reason holds, ``"worth_trying"`` when every checkable
reason fails and reuse beyond the GPU is substantial, else ``"inconclusive"``.
"""

from __future__ import annotations

import numpy as np

from policy.cost import CostParams
from policy.reuse.stats import ReuseStats

UNIQUE_PROMPTS_BELOW = 0.10    # ideal token hit ratio under which prompts count as unique
GPU_CAPTURES_AT_LEAST = 0.90   # share of the ideal reuse the GPU tier alone already captures


def verdict(stats: ReuseStats, params: CostParams, *, gpu_token_hit_ratio: float | None = None,
            ttft_slo_s: float | None = None) -> dict:
    """The reasons and the verdict. ``gpu_token_hit_ratio`` is the GPU-only prefix cache's hit
    ratio at the deployed GPU capacity (from a replay); ``ttft_slo_s`` the p99 TTFT budget."""
    ideal = stats.ideal_token_hit_ratio
    reasons = [_unique_prompts(ideal), _gpu_not_the_limit(ideal, gpu_token_hit_ratio),
               _tail_slo(stats, params, ttft_slo_s), _host_dram(), _prefix_caching(stats)]
    if any(r["holds"] for r in reasons):
        outcome = "wrong_optimisation"
    elif all(r["holds"] is False for r in reasons[:3]):
        outcome = "worth_trying"
    else:
        outcome = "inconclusive"
    return {"verdict": outcome, "reasons": reasons}


def _reason(name: str, holds: bool | None, evidence: str) -> dict:
    return {"reason": name, "holds": holds, "evidence": evidence}


def _unique_prompts(ideal: float) -> dict:
    return _reason("prompts are unique", ideal < UNIQUE_PROMPTS_BELOW,
                   f"an unlimited cache would serve {ideal:.1%} of prompt tokens "
                   f"(unique below {UNIQUE_PROMPTS_BELOW:.0%})")


def _gpu_not_the_limit(ideal: float, gpu_ratio: float | None) -> dict:
    name = "GPU memory is not the limit"
    if gpu_ratio is None:
        return _reason(name, None, "give the GPU capacity to replay the GPU-only prefix cache")
    captured = gpu_ratio / ideal if ideal else 1.0
    return _reason(name, captured >= GPU_CAPTURES_AT_LEAST,
                   f"the GPU tier alone serves {gpu_ratio:.1%} of prompt tokens, {captured:.0%} "
                   f"of the {ideal:.1%} any cache could")


def _tail_slo(stats: ReuseStats, params: CostParams, slo_s: float | None) -> dict:
    name = "the tail TTFT budget is too tight for promotions"
    if slo_s is None:
        return _reason(name, None, "give the p99 TTFT budget (--ttft-slo-s)")
    hits = np.asarray([t for t in stats.ideal_hit_tokens_per_request if t > 0], dtype=float)
    if not len(hits):
        return _reason(name, False, "no request reuses a prefix")
    p99_s = params.promotion_s(int(np.percentile(hits, 99)), "cpu")
    return _reason(name, p99_s > slo_s,
                   f"promoting the p99 reusable prefix from CPU takes {p99_s * 1e3:.1f} ms "
                   f"against a {slo_s * 1e3:.0f} ms budget")


def _host_dram() -> dict:
    return _reason("host DRAM is contested", None,
                   "a trace cannot tell; measure free host memory with `kvtier probe headroom`")


def _prefix_caching(stats: ReuseStats) -> dict:
    name = "prefix caching has not been evaluated yet"
    if stats.has_measured_gpu_hits:
        return _reason(name, False, "the trace records GPU prefix-cache hits")
    return _reason(name, None, "this trace has no measured GPU hits; enable the GPU prefix cache "
                               "and measure before adding tiers")
