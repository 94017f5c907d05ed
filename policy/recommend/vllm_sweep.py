"""vLLM's admission knob: ``store_threshold`` swept under vLLM's own tier semantics.

vLLM cannot gate by a learned priority; its nearest knob stores a block in the CPU tier only
on its N-th offer. Each candidate is replayed with the simulator's ``"vllm"`` semantics on
the training records and counted on their latest slice; the fewest recomputed tokens wins
(ties: the smaller threshold, vLLM's default 0 first).
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.events import RequestRecord
from policy.sim.config import SimConfig
from policy.sim.simulator import Simulator

STORE_THRESHOLDS = (0, 2, 3)


def best_store_threshold(records: Sequence[RequestRecord], gpu_blocks: int, cpu_blocks: int,
                         count_from: int, candidates: Sequence[int] = STORE_THRESHOLDS
                         ) -> tuple[int, dict]:
    """The chosen threshold and ``{threshold: recomputed tokens on the slice}``."""
    block_tokens = next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
    recomputed = {}
    for threshold in candidates:
        config = SimConfig(gpu_blocks=gpu_blocks, cpu_blocks=cpu_blocks, semantics="vllm",
                           store_threshold=threshold, default_block_tokens=block_tokens)
        simulator = Simulator(config)
        total = 0
        for index, record in enumerate(records):
            outcome = simulator.serve(record)
            if index >= count_from:
                total += outcome.recompute_tokens
        recomputed[threshold] = total
    return min(recomputed, key=lambda t: (recomputed[t], t)), recomputed
