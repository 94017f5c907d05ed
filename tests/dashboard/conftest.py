"""Segment folders built once per session (they are read-only for every test)."""

from __future__ import annotations

import pytest

from tests.dashboard.fixtures import MID_ROLLOUT, SIMULATED, Scenario, build_segments


@pytest.fixture(scope="session")
def full_segments(tmp_path_factory):
    return build_segments(tmp_path_factory.mktemp("full") / "segments", Scenario())


@pytest.fixture(scope="session")
def mid_rollout_segments(tmp_path_factory):
    return build_segments(tmp_path_factory.mktemp("mid") / "segments", MID_ROLLOUT)


@pytest.fixture(scope="session")
def simulated_segments(tmp_path_factory):
    return build_segments(tmp_path_factory.mktemp("sim") / "segments", SIMULATED)


@pytest.fixture
def empty_segments(tmp_path):
    root = tmp_path / "segments"
    root.mkdir()
    return root
