"""On the bundled Mooncake conversation trace (first requests only, to stay bounded)."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest

from kvtier.policy.learn.offers import collect_offers
from kvtier.policy.learn.replay import IndexedAdmitter, Tiers, replay
from kvtier.policy.readers import open_trace

BUNDLED = Path(__file__).resolve().parents[3] / "kvtier" / "data" / "mooncake_conversation_trace.jsonl.gz"


@pytest.fixture(scope="module")
def records():
    if not BUNDLED.exists():
        pytest.skip(f"bundled trace not present: {BUNDLED}")
    return list(islice(open_trace(BUNDLED).requests(), 1500))


def test_belady_boundary_labels_are_the_admission_belady_needs(records):
    # admitting exactly the offers the labels mark, into a plain LRU CPU tier, recovers
    # Belady's CPU-tier hits: the labels carry the whole LRU->Belady gap
    tiers = Tiers(gpu_blocks=400, cpu_blocks=1000)
    offers = collect_offers(records, tiers.gpu_blocks, tiers.cpu_blocks)
    oracle = {(int(i), int(k)): float(y)
              for i, k, y in zip(offers.request_index, offers.keys, offers.y)}
    lru = replay(records, tiers, "lru").result.token_hit_ratio
    belady = replay(records, tiers, "belady").result.token_hit_ratio
    admitted = replay(records, tiers, "lru", admitter=IndexedAdmitter(oracle, 0.5))
    assert belady - lru > 0.05
    assert admitted.result.token_hit_ratio == pytest.approx(belady, abs=0.005)
