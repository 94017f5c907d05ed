"""The demo's what-if curves: token hit ratio against CPU tier capacity, one line per policy.

The requests the GPU-only phase served are replayed as ``kvtier recommend`` replays them
(:func:`kvtier.policy.learn.compare.compare`): the phase's GPU tier (LRU) and a CPU tier of each
size under each policy, exclusive tiers as in the reference engine, trained on the earlier
half of the time span and counted on the later half. Belady's offline optimum in the CPU
tier is the bound; ``recommended`` is what the recommendation deploys at that size (the
admission rule and eviction order chosen together on the training period,
:mod:`kvtier.policy.learn.pairs`). The file is the dashboard's prepared-sweep format (``points``, ``chosen`` and a
``note``), the recommended size marked on LRU, the reference engine's policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvtier.collector import json_text
from kvtier.collector.events import RequestRecord
from kvtier.policy.sim.policies import policy_names

# the registry's compiled policies evaluate compares, and what the recommendation deploys
POLICIES = (*policy_names("exclusive", evaluate=True, compiled=True), "recommended")
SIZES = 12
TRAIN_FRACTION = 0.5  # as kvtier recommend's default: the curves count what it measured on
FILE_NAME = "cpu_sweep.json"


def write_cpu_sweep(records: Sequence[RequestRecord], gpu_blocks: int, chosen_blocks: int,
                    folder: Path, policies: Sequence[str] = POLICIES) -> Path:
    """Replay ``records`` at CPU sizes from none to past the chosen one; write the sweep."""
    from kvtier.policy.learn.compare import compare
    from kvtier.policy.learn.split import Split
    from kvtier.policy.learn.replay import Tiers
    from kvtier.policy.sim.trace import BlockTrace

    block_tokens = next((r.block_size_tokens for r in records if r.block_size_tokens), 16)
    split = Split.by_time(records, TRAIN_FRACTION)
    split = split.with_traces(BlockTrace.from_records(split.records, block_tokens))
    top = max(2 * chosen_blocks, 64)
    sizes = sorted({*np.linspace(0, top, SIZES).astype(int).tolist(), chosen_blocks})
    ratios: dict[tuple[str, int], float] = {}
    for size in sizes:
        for row in compare(split, Tiers(gpu_blocks, size), policies)["policies"]:
            ratios[(row["policy"], size)] = row["token_hit_ratio"]
    points = [{"policy": policy, "cpu_capacity_tokens": size * block_tokens,
               "token_hit_ratio": ratios[(policy, size)]} for policy in policies for size in sizes]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    json_text.write(path, {
        "points": points, "gpu_tokens": gpu_blocks * block_tokens,
        "chosen": {"policy": "lru", "cpu_capacity_tokens": chosen_blocks * block_tokens},
        "note": (f"Replayed as kvtier recommend does: GPU tier LRU, trained on the first "
                 f"{len(split.train)} requests, counted on the last {len(split.records) - split.count_from}; "
                 "belady: the CPU tier's offline bound; recommended: what the recommendation deploys at "
                 "each size (the admission rule and eviction order chosen together on the training "
                 "period).")},
        indent=1)
    return path
