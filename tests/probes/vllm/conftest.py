"""The real-engine scenario (``engine_run.py``), run once per session for every module that
reads it: two serving vLLM engines take minutes to start on this host."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.probes.vllm import engine_run
from tests.probes.vllm.environments import VLLM_PYTHONS


@pytest.fixture(scope="session")
def run(tmp_path_factory) -> engine_run.EngineRun:
    python = VLLM_PYTHONS["0.32"]
    if not Path(python).exists():
        pytest.fail(f"no vLLM CPU environment at {python}: run `make test-engine` (it builds it)")
    return engine_run.run_scenario(python, tmp_path_factory.mktemp("real-engine"))
