"""Shared fixtures: the real traces. Mooncake's conversation trace ships in the package; the
WEKA traces are read from ``../shared/traces`` beside the checkout (skipped when absent)."""

from pathlib import Path

import pytest

from kvtier.traces import bundled_trace

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
MOONCAKE = bundled_trace()
WEKA = TRACES / "weka" / "traces_dev.tar.gz"


@pytest.fixture
def mooncake_path() -> Path:
    return MOONCAKE


@pytest.fixture
def weka_path() -> Path:
    if not WEKA.exists():
        pytest.skip(f"real trace not present: {WEKA}")
    return WEKA
