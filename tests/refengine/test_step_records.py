"""The reference engine records one StepRecord per step that computed, and the steps account
for the same work its requests and block events do."""

from __future__ import annotations

import pytest

from kvtier.collector.store import TraceStore
from kvtier.refengine.sequence import Sequence
from tests.refengine.conftest import prompt, run_until_idle, tiny_config


def submit_all(engine, prompts: list[list[int]], prefix: str) -> None:
    for n, tokens in enumerate(prompts):
        engine.submit(Sequence(f"{prefix}{n}", tokens, 3 + n % 3, 0.0))
    run_until_idle(engine)


@pytest.mark.timeout(120)
def test_steps_add_up_to_the_requests_and_the_tier_traffic(make_engine, recorder, tmp_path, origin):
    engine = make_engine(tiny_config(tmp_path, gpu_blocks=10, cpu_blocks=6, cold_blocks=40))
    submit_all(engine, [prompt(i) for i in (1, 2, 3, 4)], "a")  # two fit at once: queueing
    submit_all(engine, [prompt(i) for i in (1, 2, 5, 1, 3)], "b")  # hits and promotions
    batch = recorder.take_events()
    with TraceStore() as store:
        store.ingest(batch)
        steps = store.query("SELECT * FROM step_records ORDER BY step").to_pylist()
        requests = store.query("SELECT * FROM requests").to_pylist()
        events = store.query("SELECT kind, tier_from, tier_to, size_bytes FROM block_events")
    events = events.to_pylist()
    assert [s["step"] for s in steps] == list(range(engine.steps)) and engine.steps > 9
    assert not batch.rejected
    total = lambda name: sum(s[name] for s in steps)  # noqa: E731
    assert total("prefill_tokens") == sum(r["recomputed_tokens"] for r in requests)
    assert total("prefill_requests") == len(requests) == 9
    assert total("cached_tokens") == sum(r["prompt_tokens"] - r["recomputed_tokens"] for r in requests)
    assert total("decode_requests") == sum(r["output_tokens"] - 1 for r in requests)
    promoted = [e for e in events if e["kind"] in ("cpu_promotion", "cold_promotion")]
    stored = [e for e in events if e["kind"] == "store" and e["tier_from"] == "gpu"]
    assert promoted and stored
    assert total("loaded_bytes") == sum(e["size_bytes"] for e in promoted)
    assert total("stored_bytes") == sum(e["size_bytes"] for e in stored)
    assert max(s["waiting_requests"] for s in steps) > 0  # the queue is visible
    assert all(1 <= s["running_requests"] <= 4 for s in steps)
    assert all(s["duration_s"] is not None and s["duration_s"] > 0 for s in steps)
    assert all(a["time_s"] <= b["time_s"] for a, b in zip(steps, steps[1:]))


def test_idle_steps_record_nothing(make_engine, recorder):
    engine = make_engine(tiny_config())
    assert engine.step() is False
    assert engine.steps == 0 and recorder.take_events() is None
