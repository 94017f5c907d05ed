"""The demo's what-if curves: token hit ratio against CPU tier capacity, one line per policy.

The requests the GPU-only phase served are replayed in the simulator with the phase's GPU
tier and a CPU tier of each size, under each eviction policy (Belady's offline optimum is
the bound), exclusive tiers as in the reference engine. The file is the dashboard's
prepared-sweep format (``points`` and ``chosen``), the recommended size marked on LRU, the
reference engine's policy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from collector.events import RequestRecord

POLICIES = ("lru", "arc", "s3fifo", "belady")
SIZES = 12
FILE_NAME = "cpu_sweep.json"


def write_cpu_sweep(records: Sequence[RequestRecord], gpu_blocks: int, chosen_blocks: int,
                    folder: Path, policies: Sequence[str] = POLICIES) -> Path:
    """Replay ``records`` at CPU sizes from none to past the chosen one; write the sweep."""
    from policy.sim.config import SimConfig
    from policy.sim.simulator import simulate

    block_tokens = next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
    top = max(2 * chosen_blocks, 64)
    sizes = sorted({*np.linspace(0, top, SIZES).astype(int).tolist(), chosen_blocks})
    points = [{"policy": policy, "cpu_capacity_tokens": size * block_tokens,
               "token_hit_ratio": simulate(records, SimConfig(
                   gpu_blocks=gpu_blocks, cpu_blocks=size, policy=policy,
                   default_block_tokens=block_tokens)).token_hit_ratio}
              for policy in policies for size in sizes]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    path.write_text(json.dumps({
        "points": points, "gpu_tokens": gpu_blocks * block_tokens,
        "chosen": {"policy": "lru", "cpu_capacity_tokens": chosen_blocks * block_tokens}},
        indent=1) + "\n")
    return path
