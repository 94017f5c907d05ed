"""Merging instances' results into a fleet's (policy/fleet.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.policy.cost import CostParams
from kvtier.policy.fleet import merge_policy_rows, merge_replays, merge_ttft
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.readers import open_trace
from kvtier.policy.latency.models import QueueModel
from kvtier.policy.whatif import what_if
from tests.kvtier.fleet_segments import MOONCAKE


@pytest.fixture(scope="module")
def halves():
    records = list(open_trace(MOONCAKE).requests())[:1200]
    return records[0::2], records[1::2]


def test_the_fleet_replay_adds_up_and_its_ttft_is_over_every_request(halves):
    config = SimConfig(gpu_blocks=300, cpu_blocks=900, default_block_tokens=512)
    parts = [(name, what_if(part, config, QueueModel(CostParams(), 2)))
             for name, part in zip(("a", "b"), halves)]
    fleet = merge_replays(parts)
    a, b = (w for _, w in parts)
    assert fleet.total.result.requests == a.result.requests + b.result.requests == 1200
    assert fleet.total.result.gpu_hit_tokens == a.result.gpu_hit_tokens + b.result.gpu_hit_tokens
    together = np.concatenate([a.ttft_samples_s, b.ttft_samples_s])
    assert fleet.total.ttft.p99_s == pytest.approx(float(np.percentile(together, 99)))
    assert fleet.total.ttft.utilisation == max(a.ttft.utilisation, b.ttft.utilisation)
    # the samples are the queue's own: summarising one instance's gives its estimate back
    assert merge_ttft([a.ttft], [a.ttft_samples_s]).p95_s == a.ttft.p95_s
    assert [p["instance"] for p in fleet.to_dict()["instances"]] == ["a", "b"]


def test_policy_rows_merge_by_name_and_refuse_a_policy_missing_on_an_instance():
    def rows(scale):
        return [{"policy": name, "gpu_hit_tokens": 10 * scale * k, "cpu_promotion_tokens": scale,
                 "cold_promotion_tokens": 0, "recompute_tokens": 100 - 10 * k,
                 "prompt_tokens": 100 + scale, "cpu_stores_total": 1, "prefill_utilisation": 0.1 * k,
                 "ttft_samples_s": np.arange(5.0) * k}
                for k, name in enumerate(("lru", "arc", "belady"), start=1)]
    merged = {r["policy"]: r for r in merge_policy_rows([rows(1), rows(2)])}
    assert merged["arc"]["gpu_hit_tokens"] == 20 + 40
    assert merged["arc"]["token_hit_ratio"] == (60 + 3) / 203
    assert merged["lru"]["gap_closed"] == 0 and merged["belady"]["gap_closed"] == 1
    assert merged["belady"]["prefill_utilisation"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="ran on 1 of 2"):
        merge_policy_rows([rows(1), rows(2)[:2]])
