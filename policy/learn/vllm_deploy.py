"""The learned next-use order for a vLLM engine: the file kvtier's cache-policy plug-in
loads, written only when the order is safe under vLLM's own semantics.

:func:`choose` (training period only) picks the readout; the plug-in itself, as a
request-scoped tier loading the document it would load (the caller passes it in: the
plug-in lives with the engine probes), is then replayed in the simulator's vLLM flow
(write-through CPU tier, request-scoped) beside vLLM's LRU at the same sizes, and counted
on later time, behind the plug-in's own online LRU shadow. A readout that still lost to LRU
there is marked unsafe and no document is produced for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvtier.collector import json_text
from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.deploy import choose, deployment
from kvtier.policy.learn.nextuse import NextUseModel
from kvtier.policy.learn.nextuse import Readout
from kvtier.policy.learn.replay import Tiers
from kvtier.policy.learn.split import Split

FILE_NAME = "next-use-policy.json"
POLICY_SETTINGS = {"eviction_policy": "KvtierNextUsePolicy",
                   "cache_policy_module_path": "kvtier.probes.vllm.next_use_policy"}


@dataclass(frozen=True)
class VllmNextUse:
    """The plug-in's deployment at ``tiers``: hit ratios on later time under vLLM semantics
    (``learned_hit_ratio`` None when no readout beat LRU on the training period)."""

    model: NextUseModel
    readout: Readout | None
    lru_hit_ratio: float
    learned_hit_ratio: float | None
    evictions: int

    @property
    def unsafe(self) -> bool:
        return self.learned_hit_ratio is not None and self.learned_hit_ratio < self.lru_hit_ratio

    @property
    def deployable(self) -> bool:
        return self.readout is not None and not self.unsafe

    def document(self) -> dict:
        """The JSON document the plug-in loads (``KVTIER_NEXT_USE_MODEL``)."""
        if not self.deployable:
            raise ValueError("no deployable next-use order (plain LRU, or it lost to LRU)")
        return deployment(self.model, self.readout)


def later_hit_ratio(split: Split, tiers: Tiers, twin=None) -> float:
    """Token hit ratio from ``split.count_from`` on, vLLM flow; ``twin`` None: vLLM's LRU."""
    from kvtier.policy.sim.config import SimConfig
    from kvtier.policy.sim.simulator import Simulator

    block_tokens = split.records[0].block_size_tokens or 16
    simulator = Simulator(SimConfig(tiers.gpu_blocks, tiers.cpu_blocks, semantics="vllm",
                                    default_block_tokens=block_tokens), cpu_tier=twin)
    served = prompt = 0
    for i, record in enumerate(split.records):
        if twin is not None:
            twin.observe_request(i, record, record.block_hashes)
        outcome = simulator.serve(record)
        if i >= split.count_from:
            prompt += record.prompt_tokens
            served += record.prompt_tokens - outcome.recompute_tokens
    return served / prompt if prompt else 0.0


def next_use_for_vllm(records: Sequence[RequestRecord], tiers: Tiers,
                      twin: Callable[[int, dict], object],
                      train_fraction: float = 0.5) -> VllmNextUse:
    """Choose on the earlier ``train_fraction`` of the time span, measure on the rest;
    ``twin(cpu_blocks, document)``: the plug-in as a request-scoped tier
    (``kvtier.probes.vllm.next_use_twin.NextUseTwin``)."""
    if tiers.cpu_blocks == 0:
        raise ValueError("the next-use order needs a CPU tier (cpu_blocks 0)")
    split = Split.by_time(records, train_fraction)
    choice = choose(split.train, tiers)
    lru = later_hit_ratio(split, tiers)
    if choice.readout is None:
        return VllmNextUse(choice.model, None, lru, None, 0)
    tier = twin(tiers.cpu_blocks, deployment(choice.model, choice.readout))
    learned = later_hit_ratio(split, tiers, tier)
    return VllmNextUse(choice.model, choice.readout, lru, learned, len(tier.decisions))


def write(result: VllmNextUse, out: Path) -> Path | None:
    """``out/next-use-policy.json`` when the order is deployable; else nothing (None)."""
    if not result.deployable:
        return None
    path = Path(out) / FILE_NAME
    return json_text.write(path, result.document(), indent=1)
