"""The overview's cross-check sentence: an engine's hooks against its own /metrics, read from
the segments; said only when they differ, naming the engine's series and what it counts."""

from __future__ import annotations

import pytest

from tests.dashboard.test_app import open_page

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("engine_prompt, refused_stores, warned", [
    (100, 0, False), (150, 0, True),
    (100, 3, False)])  # stores vLLM asked for and could not allocate: no store the hooks missed
def test_overview_warns_when_the_hooks_and_the_engines_metrics_disagree(
        monkeypatch, tmp_path, store, engine_prompt, refused_stores, warned):
    from kvtier.collector.segments import export_segments
    from tests.collector.test_crosscheck import fill

    # 150: the engine counted 50 tokens more; refused stores: 4 chunks asked for 3 times
    fill(store, second_interval_prompt=engine_prompt, asked_in_second=1 + 4 * refused_stores,
         failed_in_second=refused_stores)
    export_segments(store, tmp_path / "segments")
    at = open_page(monkeypatch, tmp_path / "segments", "overview")
    flagged = [w.value for w in at.warning if "/metrics" in w.value]
    if not warned:
        assert flagged == []
        return
    assert flagged == ["The hooks and the engine's own /metrics differ by more than 1%: node-a "
                       "prompt tokens: hooks 200 vs engine 250 (-50; vllm:prompt_tokens_total: "
                       "prompt tokens of the requests whose prefill ran). The shares below come "
                       "from the hooks' records. What the plug-ins could not ship is counted on "
                       "the collector's /metrics (kvtier_recorder_dropped_events_total); none "
                       "there means the engine's series counts differently in this version."]
