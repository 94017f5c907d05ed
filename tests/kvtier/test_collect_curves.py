"""`kvtier collect --live-curves`: bad curve flags are one line and exit 2 before anything
opens; a collector with curves writes its curve file beside its segments when it stops."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvtier.policy.livecurve.curve_values import read_live_curves

pytestmark = pytest.mark.timeout(60)


def collect(tmp_path, *flags):
    return subprocess.run([sys.executable, "-m", "kvtier", "collect", "--store",
                           str(tmp_path / "s.duckdb"), "--metrics-port", "0", "--duration-s", "1",
                           *flags], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("flags, says", [
    (["--live-curves", "--curve-cpu-tokens", "1M,banana"], "--curve-cpu-tokens: bad capacity 'banana'"),
    (["--live-curves", "--curve-cpu-tokens", "inf"], "--curve-cpu-tokens: give a size in tokens"),
    (["--live-curves", "--curve-cold-tokens", "1M"], "--live-curves: a cold ladder needs cold_above_cpu_tokens > 0"),
    (["--live-curves", "--curve-windows-s", "300,x"], "--curve-windows-s: give seconds separated by commas"),
    (["--live-curves", "--cost-params", "/nonexistent/costs.json"], "--cost-params /nonexistent/costs.json: no such file"),
    (["--curve-cpu-tokens", "1M"], "--curve-cpu-tokens needs --live-curves"),
])
def test_bad_curve_flags_exit_2_in_one_line_and_store_nothing(tmp_path, flags, says):
    result = collect(tmp_path, *flags)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"kvtier collect: error: {says}"), line
    assert not (tmp_path / "s.duckdb").exists()


def test_a_collector_with_curves_writes_its_file_beside_its_segments(tmp_path):
    result = collect(tmp_path, "--live-curves", "--curve-gpu-tokens", "64k", "--instance", "node-7",
                     "--segments", str(tmp_path / "segments"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "segments" / "live_curves" / "collector=node-7.json").is_file()
    assert read_live_curves(tmp_path / "segments") == ()  # no traffic reached it
