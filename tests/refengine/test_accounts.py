"""Three accounts of the same run agree: the recorder's block events, the vLLM-format KV
events the engine publishes (decoded by kvtier's own vLLM tap), and the per-request token
counts."""

from __future__ import annotations

from collections import Counter

import pytest

from kvtier.refengine.config import TierConfig
from kvtier.refengine.kv_publisher import KvEventPublisher
from kvtier.probes.vllm.tap import VllmEventTap
from kvtier.probes.vllm.tap_config import VllmTapConfig
from tests.refengine.conftest import prompt, run, tiny_config

LOOKUP_FIELDS = {"gpu_hit": "gpu_hit_tokens", "cpu_promotion": "cpu_promotion_tokens",
                 "cold_promotion": "cold_promotion_tokens", "recompute_miss": "recomputed_tokens"}


def movements(rows) -> Counter:
    """(kind, hash, tier) of stores (tier entered) and evictions (tier left)."""
    return Counter((r["kind"], r["block_hash"], r["tier_to"] if r["kind"] == "store" else r["tier_from"])
                   for r in rows if r["kind"] in ("store", "evict"))


def workload(engine) -> None:
    """Touches every path: GPU hits, CPU and cold promotions, stores, evictions, a switch."""
    for n, i in enumerate((1, 2, 3, 4, 3, 1, 2, 5, 1)):
        run(engine, f"r{n}", prompt(i))
    run(engine, "tail", prompt(1) + [3, 4])


@pytest.mark.timeout(60)
def test_recorder_events_match_published_kv_events(make_engine, recorder, tmp_path):
    publisher = KvEventPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    sent, batches = [], []
    tap = VllmEventTap(VllmTapConfig(endpoints=(publisher.endpoint,),
                                     replay_endpoints=((0, publisher.replay_endpoint),),
                                     heal_from_zero=True), batches.append)
    try:
        tap.open()
        engine = make_engine(tiny_config(tmp_path, gpu_blocks=5, cpu_blocks=5, cold_blocks=40),
                             publish=lambda p: (sent.append(p), publisher.publish(p)))
        workload(engine)
        engine.reconfigure(TierConfig(gpu_blocks=8, config_id="after-switch"))
        engine.step()
        for _ in range(300):  # bounded wait for the tap to catch up (live or replayed)
            if len({b.sequence for b in batches}) >= len(sent):
                break
            tap.poll(0.05)
    finally:
        tap.close()
        publisher.close()
    recorded = recorder.take_events().block_events.to_pylist()
    published = [row for b in batches for row in b.block_events.to_pylist()]
    kinds = {(r["kind"], r["tier_to"] or r["tier_from"]) for r in recorded}
    assert {("cpu_promotion", "gpu"), ("cold_promotion", "gpu"), ("gpu_hit", "gpu"),
            ("store", "cold"), ("evict", "cpu")} <= kinds
    assert len({b.sequence for b in batches}) == len(sent) > 0
    assert movements(published) == movements(recorded)


def test_request_token_counts_match_lookup_events(make_engine, recorder, tmp_path):
    engine = make_engine(tiny_config(tmp_path, gpu_blocks=5, cpu_blocks=5, cold_blocks=40))
    workload(engine)
    batch = recorder.take_events()
    per_request = Counter()
    for row in batch.block_events.to_pylist():
        if row["kind"] in LOOKUP_FIELDS:
            per_request[(row["request_id"], LOOKUP_FIELDS[row["kind"]])] += row["tokens"]
    requests = batch.requests.to_pylist()
    assert len(requests) == 10
    for record in requests:
        for field in LOOKUP_FIELDS.values():
            assert per_request[(record["request_id"], field)] == record[field], (record["request_id"], field)
        assert sum(record[f] for f in LOOKUP_FIELDS.values()) == record["prompt_tokens"]
    assert sum(r["cold_promotion_tokens"] for r in requests) > 0


def test_admission_threshold_drops_once_used_blocks(make_engine, recorder):
    engine = make_engine(tiny_config(gpu_blocks=5, cpu_blocks=20, admission_threshold=2))
    run(engine, "a", prompt(1))
    run(engine, "b", prompt(2))  # P1's blocks were used once: dropped, not stored in CPU
    again = run(engine, "c", prompt(1))
    kinds = Counter(r["kind"] for r in recorder.take_events().block_events.to_pylist())
    assert again.served.cpu == 0 and kinds["drop"] > 0
    run(engine, "d", prompt(2))  # P1 now used twice: admitted when evicted
    assert run(engine, "e", prompt(1)).served.cpu > 0


def test_reconfigure_applies_between_requests_and_names_the_phase(make_engine, recorder):
    engine = make_engine(tiny_config(gpu_blocks=5))
    run(engine, "a", prompt(1))
    engine.reconfigure(TierConfig(gpu_blocks=5, cpu_blocks=10, config_id="plus-cpu"))
    after = run(engine, "b", prompt(1))
    assert after.served.gpu == 0  # caches start empty after a switch
    ids = [r["tier_config_id"] for r in recorder.take_events().requests.to_pylist()]
    assert ids == ["gpu-only", "plus-cpu"]
    assert engine.kv.cpu is not None


def test_reconfigure_rejects_a_file_tier_without_a_folder(make_engine):
    engine = make_engine(tiny_config(gpu_blocks=5))
    with pytest.raises(ValueError, match="file_dir"):
        engine.reconfigure(TierConfig(gpu_blocks=5, cpu_blocks=4, cold_blocks=4))
