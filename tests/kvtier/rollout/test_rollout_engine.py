"""The rollout against the reference engine: real switching, real load, measured phases."""

from __future__ import annotations

import pytest

from kvtier.rollout.drive import phase_driver
from kvtier.rollout.plan import RolloutPlan
from kvtier.rollout.runner import EngineAdminSwitcher, run_rollout
from kvtier.probes.active.load import LoadConfig
from kvtier.refengine.config import EngineConfig, TierConfig
from kvtier.refengine.server import EngineServer, ServerSettings
from tests.kvtier.rollout.test_rollout import looping_trace

pytestmark = pytest.mark.timeout(180)


def test_cpu_tier_turns_recomputes_into_promotions_on_the_reference_engine(tmp_path):
    config = EngineConfig(tiers=TierConfig(gpu_blocks=8), file_dir=str(tmp_path / "files"))
    server = EngineServer(config, ServerSettings(port=0)).start()
    try:
        trace = looping_trace(prompts=4, blocks=4, rounds=4)  # comes back every 16 blocks
        load = LoadConfig(concurrency=(1,), requests_per_level=len(trace), max_tokens=2, max_blocks=4)
        plan = RolloutPlan(gpu_blocks=8, cpu_blocks=32, cold_blocks=64, min_cold_gain=0.5)
        switcher = EngineAdminSwitcher(server.url)
        report = run_rollout(plan, switcher, phase_driver(server.url, trace, load), block_tokens=16)
    finally:
        server.stop()
    gpu_only, with_cpu = report.phases
    assert gpu_only.summary["shares"]["cpu_promotion"] == 0
    assert with_cpu.summary["shares"]["cpu_promotion"] > 0.5
    assert {r.tier_config_id for r in with_cpu.records} == {"gpu+cpu"}
    assert gpu_only.errors == 0 and with_cpu.errors == 0
    assert report.skipped and report.skipped[0][0] == "gpu+cpu+file"  # everything fit in GPU+CPU already
