from __future__ import annotations

import pytest

from kvtier.collector.events import Origin, Outcome, RequestRecord, Tier
from kvtier.collector.recorder import Recorder
from tests.collector.exports.otlp_receiver import OtlpReceiver

T0 = 1_800_000_000.0
CPU_LATENCIES_S = [0.0004 * (i + 1) for i in range(50)]  # 0.4 ms .. 20 ms
COLD_LATENCIES_S = [0.03, 0.04, 0.06]


def sample_batch(sequence: int = 0, origin: Origin | None = None):
    """One batch with every outcome kind, promotions with known latencies, and requests."""
    origin = origin or Origin("vllm", "node-1", "node-1/test")
    recorder = Recorder(origin)
    for i, latency in enumerate(CPU_LATENCIES_S):
        recorder.record(Outcome.CPU_PROMOTION, 100 + i, "req-a", None, i, 16, 65536, Tier.CPU, Tier.GPU,
                        None, latency, T0 + 1 + i * 0.001)
    for i, latency in enumerate(COLD_LATENCIES_S):
        recorder.record(Outcome.COLD_PROMOTION, 200 + i, "req-b", None, i, 16, 65536, Tier.COLD, Tier.GPU,
                        None, latency, T0 + 2)
    for i in range(7):
        recorder.record(Outcome.GPU_HIT, 300 + i, "req-b", None, 3 + i, 16, None, None, Tier.GPU, time_s=T0 + 2)
    for i in range(4):
        recorder.record(Outcome.RECOMPUTE_MISS, 400 + i, "req-b", None, 10 + i, 16, None, None, Tier.GPU,
                        latency_s=0.002, time_s=T0 + 2.01 + i * 0.002)
    recorder.record(Outcome.EVICT, 500, tier_from=Tier.CPU, time_s=T0 + 3)
    recorder.record_request(RequestRecord("req-a", T0 + 1, 800, 20, gpu_hit_tokens=0, cpu_promotion_tokens=800,
                                          cold_promotion_tokens=0, recomputed_tokens=0, ttft_s=0.08, itl_s=0.012,
                                          e2e_latency_s=0.4, tier_config_id="gpu+cpu"))
    recorder.record_request(RequestRecord("req-b", T0 + 2, 224, 10, gpu_hit_tokens=112, cpu_promotion_tokens=0,
                                          cold_promotion_tokens=48, recomputed_tokens=64, ttft_s=0.3, itl_s=0.02,
                                          e2e_latency_s=0.5, tier_config_id="gpu+cpu+cold", session_id="s-1"))
    batch = recorder.take_events()
    return batch if sequence == 0 else type(batch)(origin, sequence, batch.block_events, batch.requests)


@pytest.fixture
def otlp_receiver():
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()
