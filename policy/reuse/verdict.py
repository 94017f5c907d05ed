"""Is offloading the wrong optimisation for this traffic? The seed's reasons, each checked.

Each reason is ``holds`` (True: a reason not to offload), ``False`` (checked, does not hold)
or ``None`` (the inputs cannot tell; the evidence says what would). The verdict is
``"do_not_offload"`` when any reason holds, ``"offload"`` when the first three (unique
prompts, GPU not the limit, tail budget) are checked and fail, else ``"inconclusive"``.
``kvtier analyze`` and ``kvtier recommend`` both call :func:`verdict`, so given the same
inputs they say the same (:class:`kvtier.policy.recommend.values.Verdict`).
"""

from __future__ import annotations

import numpy as np

from kvtier.policy.cost import CostParams
from kvtier.policy.recommend.values import Reason, Verdict
from kvtier.policy.reuse.stats import ReuseStats

UNIQUE_PROMPTS_BELOW = 0.10    # ideal token hit ratio under which prompts count as unique
GPU_CAPTURES_AT_LEAST = 0.90   # share of the ideal reuse the GPU tier alone already captures


def verdict(stats: ReuseStats, params: CostParams, *, gpu_token_hit_ratio: float | None = None,
            ttft_slo_s: float | None = None, host_cap_bytes: int | None = None) -> Verdict:
    """The reasons and the verdict. ``gpu_token_hit_ratio`` is the GPU-only prefix cache's hit
    ratio at the deployed GPU capacity (from a replay); ``ttft_slo_s`` the p99 TTFT budget;
    ``host_cap_bytes`` the host memory a CPU tier may take (``kvtier probe headroom``)."""
    ideal = stats.ideal_token_hit_ratio
    block_bytes = (stats.block_tokens or 16) * params.model.bytes_per_token
    reasons = (_unique_prompts(ideal), _gpu_not_the_limit(ideal, gpu_token_hit_ratio),
               _tail_slo(stats, params, ttft_slo_s), _host_dram(host_cap_bytes, block_bytes),
               _prefix_caching(stats))
    if any(r.holds for r in reasons):
        outcome = "do_not_offload"
    elif all(r.holds is False for r in reasons[:3]):
        outcome = "offload"
    else:
        outcome = "inconclusive"
    return Verdict(outcome, reasons)


def _reason(name: str, holds: bool | None, evidence: str) -> Reason:
    return Reason(name, holds, evidence)


def _unique_prompts(ideal: float) -> Reason:
    return _reason("prompts are unique", ideal < UNIQUE_PROMPTS_BELOW,
                   f"an unlimited cache would serve {ideal:.1%} of prompt tokens "
                   f"(unique below {UNIQUE_PROMPTS_BELOW:.0%})")


def _gpu_not_the_limit(ideal: float, gpu_ratio: float | None) -> Reason:
    name = "GPU memory is not the limit"
    if gpu_ratio is None:
        return _reason(name, None, "give the GPU capacity to replay the GPU-only prefix cache")
    captured = gpu_ratio / ideal if ideal else 1.0
    return _reason(name, captured >= GPU_CAPTURES_AT_LEAST,
                   f"the GPU tier alone serves {gpu_ratio:.1%} of prompt tokens, {captured:.0%} "
                   f"of the {ideal:.1%} any cache could")


def _tail_slo(stats: ReuseStats, params: CostParams, slo_s: float | None) -> Reason:
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


def _host_dram(cap_bytes: int | None, block_bytes: int) -> Reason:
    name = "host DRAM is contested"
    if cap_bytes is None:
        return _reason(name, None, "a trace cannot tell; measure free host memory with "
                                   "`kvtier probe headroom` (--headroom-json)")
    return _reason(name, cap_bytes < block_bytes,
                   f"the host headroom leaves {cap_bytes / 2**30:.2f} GiB for a CPU tier "
                   f"(one block is {block_bytes:,} bytes)")


def _prefix_caching(stats: ReuseStats) -> Reason:
    name = "prefix caching has not been evaluated yet"
    if stats.has_measured_gpu_hits:
        return _reason(name, False, "the trace records GPU prefix-cache hits")
    return _reason(name, None, "this trace has no measured GPU hits; enable the GPU prefix cache "
                               "and measure before adding tiers")
