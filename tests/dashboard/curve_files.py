"""A live curve file as a collector writes it: real curves kept from two instances' traffic
(one vLLM, one with exclusive tiers), a cost file and a TTFT budget for the headroom."""

from __future__ import annotations

import json
from pathlib import Path

from kvtier.collector.events import RequestRecord
from kvtier.policy.livecurve.config import CurveConfig
from kvtier.policy.livecurve.live_curves import LiveCurves
from tests.conftest import FixedClock
from tests.policy.livecurve.fleet_traffic import fleet_batches, instance_requests

LADDER = (0, 768, 1536, 3072, 6144)
ENGINES = {"node-a": "vllm", "node-b": "reference"}


def measured(record: RequestRecord) -> RequestRecord:
    """``record`` with an engine's tier split: half its prompt from the GPU."""
    from dataclasses import replace

    half = record.prompt_tokens // 2
    return replace(record, gpu_hit_tokens=half, cpu_promotion_tokens=0, cold_promotion_tokens=0,
                   recomputed_tokens=record.prompt_tokens - half)


def write_live_curves(segments: Path) -> Path:
    """Write the file into ``segments/live_curves/`` and return that folder."""
    costs = segments.parent / "costs.json"
    costs.write_text(json.dumps({"probe": "calibrate", "cost_params": {"prefill_tokens_per_s": 8000.0}}))
    clock = FixedClock()
    curves = LiveCurves(CurveConfig(cpu_ladder_tokens=LADDER, gpu_tokens=1024, ttft_budget_s=0.5),
                        collector="node-a", cost_file=costs, clock=clock)
    traffic = {name: [measured(r) for r in instance_requests(seed=i, requests=60, name=name)]
               for i, name in enumerate(ENGINES)}
    for batch in fleet_batches(traffic, ENGINES):
        curves.observe(batch)
        clock.advance(2.0)
    curves.flush()
    curves.refresh()
    return curves.export(segments).parent
