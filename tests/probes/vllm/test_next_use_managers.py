"""kvtier's next-use policy inside vLLM's real CPU offloading manager, in both vLLM versions
kvtier supports (0.33 hands ``insert`` the request, 0.32 only announces the keys first)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.probes.vllm.environments import VLLM_PYTHONS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("version", sorted(VLLM_PYTHONS))
def test_a_conversation_that_moved_on_is_evicted_first_deepest_block_first(version):
    python = VLLM_PYTHONS[version]
    if not Path(python).exists():
        pytest.skip(f"no vLLM {version} environment at {python} (make builds it)")
    done = subprocess.run([python, str(Path(__file__).with_name("next_use_side.py"))],
                          capture_output=True, text=True, timeout=170,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, done.stderr[-2000:]
    out = json.loads(line[len("RESULT "):])
    assert out["vllm_version"].startswith(version)
    # LRU would evict 0 then 1; s1's turn c superseded a, so a's blocks go, deepest first;
    # then b (the least recently used request), then c
    assert out["evicted"] == [[], [], [], [1], [0], [2, 3]]
