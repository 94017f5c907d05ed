"""The latency page draws the guardrail's moves on the timeline of the p99 they reacted to,
and lists them; from segments a collector exported (requests and tier moves). The
recommendation page says when the collector last checked the pushed promise live."""

from __future__ import annotations

import pytest

from kvtier.collector.batch import EventBatch
from kvtier.collector.block_kinds import Tier
from kvtier.collector.columns import empty_table, rows_to_table
from kvtier.collector.events import BlockEvent, Origin, RequestRecord
from kvtier.collector.moves import TierMove
from kvtier.collector.segments import export_segments
from tests.dashboard.fixtures import write_recommendation
from tests.dashboard.test_app import CHECKED, charts, open_page

pytestmark = pytest.mark.timeout(120)
CONFIGURED = "gpu+cpu:8388608"
PAUSED = CONFIGURED + ";paused=loads:cpu"


def moves_batch(origin, sequence, moves) -> EventBatch:
    table, _ = rows_to_table(TierMove, moves)
    return EventBatch(origin, sequence, empty_table(BlockEvent), empty_table(RequestRecord),
                      tier_moves=table)


@pytest.fixture
def guarded_segments(tmp_path, store, clock):
    start = clock() - 600
    engine = Origin("vllm", "node-7", "vllm-hooks:node-7:e:1")
    requests = [RequestRecord(f"r{i}", start + i, 512, ttft_s=1.5 if 120 <= i < 180 else 0.2,
                              itl_s=0.01, tier_config_id=PAUSED if 200 <= i < 300 else CONFIGURED)
                for i in range(400)]
    store.ingest(EventBatch.from_rows(engine, 0, requests=requests))
    guardrail = Origin("vllm", "node-7", "kvtier-guardrail:node-7:1")
    store.ingest(moves_batch(guardrail, 0, [
        TierMove(start + 190, "pause", "loads", Tier.CPU, "rule", "act", "ttft_p99_over_budget",
                 PAUSED, 1.5, 0.01, 1.0, 4),
        TierMove(start + 300, "resume", "loads", Tier.CPU, "rule", "act", "within_budget",
                 CONFIGURED, 0.2, 0.01, None, 9)]))
    store.ingest(moves_batch(engine, 1, [
        TierMove(start + 191, "pause", "loads", Tier.CPU, "engine", None, "command", PAUSED,
                 command=4)]))
    export_segments(store, tmp_path / "segments")
    return tmp_path / "segments"


def test_the_moves_are_drawn_beside_the_p99_and_listed(monkeypatch, guarded_segments):
    at = open_page(monkeypatch, guarded_segments, "latency")
    layered = [spec for spec, _ in charts(at) if "layer" in spec and spec["layer"][1]["mark"]["type"] == "rule"]
    assert layered, "no chart marks the guardrail's moves"
    marks = layered[0]["layer"][1]["data"]["values"]
    assert [(m["actor"], m["action"], m["paused"]) for m in marks] == [
        ("rule", "pause", "loads from cpu"), ("engine", "pause", "loads from cpu"),
        ("rule", "resume", "loads from cpu")]
    assert marks[0]["ttft_p99_ms"] == pytest.approx(1500) and marks[0]["budget_ms"] == pytest.approx(1000)
    assert "Guardrail moves" in [h.value for h in at.subheader]
    (table,) = [d.value for d in at.dataframe if "actor" in d.value.columns]
    assert list(table["reason"]) == ["ttft_p99_over_budget", "command", "within_budget"]


def test_without_moves_the_timeline_is_the_p99_alone(monkeypatch, full_segments):
    at = open_page(monkeypatch, full_segments, "latency")
    assert not any("layer" in spec for spec, _ in charts(at) if "p99_ms" in str(spec))
    assert "Guardrail moves" not in [h.value for h in at.subheader]


def test_the_recommendation_page_says_the_promise_is_watched_live(monkeypatch, full_segments,
                                                                  tmp_path):
    import json

    folder = write_recommendation(tmp_path / "reco", ttft_p99_budget_s=None)
    (folder / "recommendation.check.json").write_text(json.dumps({**CHECKED, "watched_s": 1.8e9}))
    at = open_page(monkeypatch, full_segments, "recommendation", recommendation=folder)
    assert any("Watched live" in c.value and "2027-01-15 08:00:00 UTC" in c.value for c in at.caption)
    assert any("A prediction did not hold" in e.value for e in at.error)
