"""Shared fixtures: paths to the real traces (skipped when ../shared/traces is absent)."""

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"
WEKA = TRACES / "weka" / "traces_dev.tar.gz"


@pytest.fixture
def mooncake_path() -> Path:
    if not MOONCAKE.exists():
        pytest.skip(f"real trace not present: {MOONCAKE}")
    return MOONCAKE


@pytest.fixture
def weka_path() -> Path:
    if not WEKA.exists():
        pytest.skip(f"real trace not present: {WEKA}")
    return WEKA
