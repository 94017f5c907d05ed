"""vLLM's CPU-tier knobs and its file tier, each replayed under vLLM's own tier semantics.

vLLM cannot gate by a learned priority; its nearest knob stores a block in the CPU tier only
on its N-th offer (``store_threshold``), and its CPU tier evicts by ``lru`` or ``arc``; kvtier's
connector can also keep a block out of vLLM's GPU prefix cache until its N-th request
(``kvtier_gpu_sightings``). Each setting is replayed with the simulator's ``"vllm"`` semantics
on the training records and counted on their latest slice; the fewest recomputed tokens wins
(ties: vLLM's defaults first, ``lru``, the smaller threshold, the GPU unfiltered). The file tier is replayed the same
way (with ``store_threshold`` 0: vLLM's ``TieringOffloadingSpec`` refuses any other), and
its gain is the share of the slice's prompt tokens it saves from recompute against the
chosen CPU-only setting.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.replay import Replayed, RequestTokens
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.sim.result import SimResult
from kvtier.policy.sim.simulator import Simulator

STORE_THRESHOLDS = (0, 2, 3)
CPU_POLICIES = ("lru", "arc")  # what vLLM 0.33 ships


def best_cpu_setting(records: Sequence[RequestRecord], gpu_blocks: int, cpu_blocks: int,
                     count_from: int, policies: Sequence[str] = CPU_POLICIES,
                     thresholds: Sequence[int] = STORE_THRESHOLDS,
                     gpu_sightings: Sequence[int] = (0,)
                     ) -> tuple[tuple[str, int, int], dict]:
    """The chosen ``(eviction_policy, store_threshold, gpu_sightings)`` and ``{(policy,
    threshold, gpu_sightings): recomputed tokens on the slice}``."""
    recomputed = {(policy, threshold, gpu): recomputed_tokens(
                      records, _config(records, gpu_blocks, cpu_blocks, 0, threshold, policy,
                                       gpu), count_from)
                  for gpu in gpu_sightings for policy in policies for threshold in thresholds}
    chosen = min(recomputed, key=lambda k: (recomputed[k], k[0] != "lru", k[1], k[2]))
    return chosen, recomputed


def cold_tier_gain(records: Sequence[RequestRecord], gpu_blocks: int, cpu_blocks: int,
                   cold_blocks: int, count_from: int, recomputed_without: int,
                   policy: str = "lru", gpu_sightings: int = 0) -> float:
    """Share of the slice's prompt tokens a ``cold_blocks`` file tier saves from recompute,
    against ``recomputed_without`` (the CPU-only setting's recomputed tokens)."""
    with_file = recomputed_tokens(records, _config(records, gpu_blocks, cpu_blocks,
                                                   cold_blocks, 0, policy, gpu_sightings),
                                  count_from)
    prompt = sum(r.prompt_tokens for r in records[count_from:])
    return (recomputed_without - with_file) / prompt if prompt else 0.0


def vllm_replay(records: Sequence[RequestRecord], gpu_blocks: int, cpu_blocks: int,
                count_from: int, setting: tuple[str, int, int] = ("lru", 0, 0)) -> Replayed:
    """``records`` replayed under vLLM's semantics at these sizes and ``(eviction_policy,
    store_threshold, gpu_sightings)`` (as :func:`best_cpu_setting` chooses it): what vLLM
    itself would serve. Totals and each request's tokens count from ``count_from`` on; the
    earlier requests only warm the tiers."""
    policy, threshold, gpu = setting
    simulator = Simulator(_config(records, gpu_blocks, cpu_blocks, 0, threshold, policy, gpu))
    outcomes = []
    for index, record in enumerate(records):
        outcome = simulator.serve(record)
        if index >= count_from:
            outcomes.append(RequestTokens(outcome.gpu_hit_tokens, outcome.cpu_promotion_tokens,
                                          outcome.cold_promotion_tokens, outcome.recompute_tokens))
    counted = records[count_from:]
    result = SimResult(requests=len(counted), prompt_tokens=sum(r.prompt_tokens for r in counted),
                       **{name: sum(getattr(o, name) for o in outcomes) for name in (
                           "gpu_hit_tokens", "cpu_promotion_tokens", "cold_promotion_tokens",
                           "recompute_tokens")})
    return Replayed(result, tuple(counted), tuple(outcomes))


def recomputed_tokens(records: Sequence[RequestRecord], config: SimConfig,
                      count_from: int) -> int:
    simulator = Simulator(config)
    total = 0
    for index, record in enumerate(records):
        outcome = simulator.serve(record)
        if index >= count_from:
            total += outcome.recompute_tokens
    return total


def _config(records, gpu_blocks: int, cpu_blocks: int, cold_blocks: int,
            store_threshold: int, policy: str = "lru", gpu_sightings: int = 0) -> SimConfig:
    block_tokens = next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
    return SimConfig(gpu_blocks=gpu_blocks, cpu_blocks=cpu_blocks, cold_blocks=cold_blocks,
                     semantics="vllm", policy=policy, store_threshold=store_threshold,
                     gpu_sightings=gpu_sightings, default_block_tokens=block_tokens)
