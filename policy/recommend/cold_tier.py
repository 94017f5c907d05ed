"""Whether to add a file (cold) tier: a cold promotion must cost less than recomputing.

The seed's rule: a secondary tier only if its retention value justifies it. Two checks, in
order: (1) a cold promotion of a block (file -> CPU -> GPU) must cost less than recomputing
the block's tokens, else a hit in the file tier is no better than a miss, whatever the
simulated hit gain; (2) the simulated gain in prompt tokens served from cache must reach the
bar. The costs come from the cost model (:mod:`kvtier.policy.cost`: its defaults, or the file-tier
probe's measurements, ``kvtier probe fs --json``) or from a store's own measured latencies.
``kvtier recommend`` (vLLM) and ``kvtier rollout`` both decide with :func:`decide`.
"""

from __future__ import annotations

from kvtier.policy.cost import CostParams
from kvtier.policy.recommend.values import ColdCost, ColdTierDecision

MIN_COLD_GAIN = 0.02  # the rollout plan's default bar


def decide(gain: float, min_gain: float, cost: ColdCost, cold_blocks: int = 0) -> ColdTierDecision:
    """Add the file tier (of ``cold_blocks``) only if a cold promotion is cheaper than
    recomputing and the simulated gain reaches ``min_gain``; the reason carries the figures."""
    if cost.promotion_s >= cost.recompute_s:
        reason = (f"do not add a file tier: {cost.text}, so a file-tier hit saves nothing "
                  f"(simulated gain {gain:.1%} of prompt tokens)")
        return ColdTierDecision(False, reason, gain, min_gain, cost, cold_blocks)
    if gain < min_gain:
        reason = (f"retention value too low: the file tier would serve {gain:.1%} more prompt "
                  f"tokens (bar: {min_gain:.0%}); {cost.text}")
        return ColdTierDecision(False, reason, gain, min_gain, cost, cold_blocks)
    reason = (f"add a file tier: it would serve {gain:.1%} more prompt tokens "
              f"(bar: {min_gain:.0%}), and {cost.text}")
    return ColdTierDecision(True, reason, gain, min_gain, cost, cold_blocks)


def cost_from_params(params: CostParams, block_tokens: int) -> ColdCost:
    """The cost model's figures; measured where a probe set the cold->CPU parameters."""
    measured = "measured" in (params.cold_cpu_bandwidth_bytes_per_s.source,
                              params.cold_cpu_op_latency_s.source)
    source = ("cost model, cold->CPU measured by kvtier probe fs" if measured
              else "cost model defaults, not measured: run kvtier probe fs")
    return ColdCost(block_tokens, params.promotion_s(block_tokens, "cold"),
                    params.recompute_s(block_tokens), source, measured)


def cost_from_latencies(block_tokens: int, cold_s_per_token: float | None,
                        recompute_s_per_token: float | None, params: CostParams,
                        where: str) -> ColdCost | None:
    """From measured per-token latencies (``None``: not measured); ``None`` when cold
    promotions were not measured. A missing recompute figure comes from the cost model."""
    if cold_s_per_token is None:
        return None
    recompute = (recompute_s_per_token * block_tokens if recompute_s_per_token
                 else params.recompute_s(block_tokens))
    what = "recompute measured too" if recompute_s_per_token else "recompute from the cost model"
    return ColdCost(block_tokens, cold_s_per_token * block_tokens, recompute,
                    f"median measured latency per token in {where}; {what}", True)
