"""Group commits: what a tap hands over at once is stored in one transaction, and folded into
the metrics and the observers once per engine stream, in order, duplicates left out."""

from __future__ import annotations

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.events import BlockEvent, Origin, Outcome, RequestRecord, Tier
from kvtier.collector.service import CollectorConfig, CollectorService


def shipment(origin: Origin, sequence: int, hashes: list[int]) -> EventBatch:
    rid = f"{origin.instance}-{sequence}"
    return EventBatch.from_rows(
        origin, sequence,
        [BlockEvent(1.8e9 + sequence, Outcome.GPU_HIT, h, request_id=rid, position=i, tokens=16,
                    tier_to=Tier.GPU) for i, h in enumerate(hashes)]
        + [{"time_s": 1.0, "kind": "teleport", "block_hash": 1}],  # one row refused
        [RequestRecord(rid, 1.8e9 + sequence, 16 * len(hashes))])


class Seen:
    """An ingest observer that keeps what it was shown."""

    def __init__(self):
        self.batches = []

    def observe(self, batch):
        self.batches.append(batch)

    def refresh(self):
        return None

    def flush(self):
        return None

    def samples(self):
        return []

    def export(self, folder):
        return None


def test_joined_batches_keep_their_rows_in_order_and_sum_their_rejections():
    a = Origin("vllm", "a", "hooks:a:1")
    first, second = shipment(a, 0, [1, 2]), shipment(a, 1, [3])
    joined = EventBatch.joined([first, second])
    assert joined.block_events.column("block_hash").to_pylist() == [1, 2, 3]
    assert joined.requests.column("request_id").to_pylist() == ["a-0", "a-1"]
    assert joined.rejected == {"unknown outcome": 2} and joined.sequence == 0
    assert EventBatch.joined([first]) is first
    with pytest.raises(ValueError, match="one origin"):
        EventBatch.joined([first, shipment(Origin("vllm", "b", "hooks:b:1"), 0, [9])])


def test_a_group_is_folded_in_once_per_stream_in_order_without_its_duplicates(tmp_path):
    a, b = Origin("vllm", "a", "hooks:a:1"), Origin("vllm", "b", "hooks:b:1")
    seen = Seen()
    service = CollectorService(CollectorConfig(store_path=tmp_path / "kvtier.duckdb",
                                               metrics_port=None, export_every_s=3600),
                               observers=[seen]).start()
    try:
        service.ingest(shipment(a, 0, [1, 2]))
        results = service.ingest_many([shipment(b, 0, [7]), shipment(a, 1, [3, 4]),
                                       shipment(a, 0, [1, 2]), shipment(a, 2, [5])])
        assert [r.duplicate for r in results] == [False, False, True, False]
        assert [(x.origin.instance, x.block_events.column("block_hash").to_pylist())
                for x in seen.batches] == [("a", [1, 2]), ("b", [7]), ("a", [3, 4, 5])]
        counted = {labels[3]: value for labels, value in service.state.block_events.items()}
        assert counted == {"a": 5, "b": 1}  # every stored row once, the replay not again
        assert sum(service.state.rejected_rows.values()) == 4
    finally:
        service.stop()
