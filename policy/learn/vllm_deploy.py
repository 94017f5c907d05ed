"""The learned next-use order for a vLLM engine: the file kvtier's cache-policy plug-in
loads, written only when the order is safe under vLLM's own semantics.

:func:`choose` (training period only) picks the readout; the plug-in itself, as a
request-scoped tier loading the document it would load (the caller passes it in: the
plug-in lives with the engine probes), is then replayed in the simulator's vLLM flow
(write-through CPU tier, request-scoped) beside vLLM's LRU at the same sizes, and counted
on later time, behind the plug-in's own online LRU shadow. A readout that still lost to LRU
there is marked unsafe and no document is produced for it. The simple rule vLLM runs itself
(``store_threshold`` 2) is replayed beside them: the plug-in shadows LRU's order, not that
rule's admission, so where it serves less than the rule the report says by how much.
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
from kvtier.policy.learn.pairs import SIMPLE_RULE_SIGHTINGS
from kvtier.policy.learn.replay import Tiers
from kvtier.policy.learn.split import Split

FILE_NAME = "next-use-policy.json"
POLICY_SETTINGS = {"eviction_policy": "KvtierNextUsePolicy",
                   "cache_policy_module_path": "kvtier.probes.vllm.next_use_policy"}


@dataclass(frozen=True)
class VllmNextUse:
    """The plug-in's deployment at ``tiers``: hit ratios on later time under vLLM semantics
    (``learned_hit_ratio`` None when no readout beat LRU on the training period), beside
    vLLM's LRU and the simple rule vLLM runs itself (its LRU storing a block on its second
    request, ``store_threshold`` 2: :data:`~kvtier.policy.learn.pairs.SIMPLE_RULE`)."""

    model: NextUseModel
    readout: Readout | None
    lru_hit_ratio: float
    learned_hit_ratio: float | None
    evictions: int
    simple_rule_hit_ratio: float | None = None

    @property
    def behind_simple_rule(self) -> float | None:
        """How far (hit ratio) the plug-in served below the simple rule; None when not."""
        if self.learned_hit_ratio is None or self.simple_rule_hit_ratio is None:
            return None
        behind = self.simple_rule_hit_ratio - self.learned_hit_ratio
        return behind if behind > 0 else None

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


def later_hit_ratio(split: Split, tiers: Tiers, twin=None, store_threshold: int = 0) -> float:
    """Token hit ratio from ``split.count_from`` on, vLLM flow; ``twin`` None: vLLM's LRU;
    ``store_threshold`` vLLM's (0: every block stored)."""
    from kvtier.policy.sim.config import SimConfig
    from kvtier.policy.sim.simulator import Simulator

    block_tokens = split.records[0].block_size_tokens or 16
    simulator = Simulator(SimConfig(tiers.gpu_blocks, tiers.cpu_blocks, semantics="vllm",
                                    default_block_tokens=block_tokens,
                                    store_threshold=store_threshold), cpu_tier=twin)
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
    simple = later_hit_ratio(split, tiers, store_threshold=SIMPLE_RULE_SIGHTINGS)
    if choice.readout is None:
        return VllmNextUse(choice.model, None, lru, None, 0, simple)
    tier = twin(tiers.cpu_blocks, deployment(choice.model, choice.readout))
    learned = later_hit_ratio(split, tiers, tier)
    return VllmNextUse(choice.model, choice.readout, lru, learned, len(tier.decisions), simple)


def write(result: VllmNextUse, out: Path) -> Path | None:
    """``out/next-use-policy.json`` when the order is deployable; else nothing (None)."""
    if not result.deployable:
        return None
    path = Path(out) / FILE_NAME
    return json_text.write(path, result.document(), indent=1)
