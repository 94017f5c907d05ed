"""kvtier's vLLM connector records one StepRecord per scheduler step from vLLM's own
``SchedulerOutput`` classes, in both vLLM versions kvtier supports (``side_steps.py`` runs the
fixed step sequence in each environment): every field of every row is determined."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from kvtier.collector.events import StepRecord
from tests.probes.vllm.environments import VLLM_PYTHONS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", params=sorted(VLLM_PYTHONS), ids=lambda v: f"vllm-{v}")
def driven(request) -> dict:
    python = VLLM_PYTHONS[request.param]
    if not Path(python).exists():
        pytest.skip(f"no vLLM {request.param} environment at {python} (make builds it)")
    done = subprocess.run([python, str(Path(__file__).with_name("side_steps.py"))],
                          capture_output=True, text=True, timeout=170,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, done.stderr[-2000:]
    out = json.loads(line[len("RESULT "):])
    assert out["vllm_version"].startswith(request.param)
    return out


def test_a_fixed_step_sequence_yields_exactly_the_expected_step_records(driven):
    steps = [StepRecord(*row) for row in driven["steps"]]  # each one valid under the schema
    expected = [
        # A's first prefill over its 16 CPU-tier tokens (one 4096-byte chunk loaded) and B's
        # first chunk; two chunks offloaded
        StepRecord(10.0, 0, 0.05, prefill_tokens=56, prefill_requests=2, prefill_context_tokens=16,
                   cached_tokens=16, running_requests=2, loaded_bytes=4096, stored_bytes=8192),
        # A decodes; B's next chunk continues its prompt (not cached: context it computed)
        StepRecord(10.1, 1, 0.08, prefill_tokens=68, prefill_requests=1, prefill_context_tokens=32,
                   decode_requests=1, decode_context_tokens=40, running_requests=2,
                   stored_bytes=4096),
        # step 2 only started C's load (C waits for it); step 3 did nothing: not recorded
        StepRecord(10.2, 2, 0.01, loaded_bytes=4096),
        # steps 4 and 5 overlap; each ends in its own order
        StepRecord(10.3, 4, 0.05, decode_requests=1, decode_context_tokens=41, running_requests=1,
                   preempted_requests=1),
        StepRecord(10.32, 5, 0.07, prefill_tokens=84, prefill_requests=1, prefill_context_tokens=16,
                   cached_tokens=16, decode_requests=1, decode_context_tokens=42,
                   running_requests=2),
    ]
    assert [s.step for s in steps] == [e.step for e in expected]
    for got, want in zip(steps, expected):
        assert got.duration_s == pytest.approx(want.duration_s)
        assert got == dataclasses.replace(want, duration_s=got.duration_s)
    assert driven["dropped"] == 0
