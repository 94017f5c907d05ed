"""`kvtier recommend --live-curves`: the collector's live curve of each instance recommended
for is printed as the starting point; a file that is not one is one line and exit 2, before
any work."""

from __future__ import annotations

import pytest

from kvtier.cli import main
from kvtier.policy.livecurve.curve_values import read_live_curves
from tests.dashboard.curve_files import write_live_curves
from tests.kvtier.fleet_segments import fleet_segments

pytestmark = pytest.mark.timeout(600)
RECOMMEND = ["recommend", "--gpu-tokens", "200k", "--cpu-tokens", "1M", "--engine", "vllm",
             "--host-headroom-bytes", str(64 << 30)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    segments = fleet_segments(root, max_requests=400)  # node-a and node-b
    return segments, write_live_curves(root / "collector-segments")


def test_each_instances_live_curve_is_printed_beside_its_recommendation(fleet, tmp_path, capsys):
    segments, curves = fleet
    assert main([*RECOMMEND, "--trace", str(segments), "--out", str(tmp_path / "out"),
                 "--live-curves", str(curves)]) == 0
    out = capsys.readouterr().out
    for curve in read_live_curves(curves):
        reach = next(r for r in curve.window("all").reach if r.percent == 90)
        line = next(l for l in out.splitlines() if l.startswith(f"live curve of {curve.engine}/{curve.instance}"))
        assert f"GPU alone {curve.window('all').gpu_hit_ratio:.1%}" in line
        assert f"a CPU tier of {reach.size_bytes / (1 << 30):.1f} GiB serves 90%" in out
    assert "instance node-a: verdict:" in out  # the recommendations themselves follow


def test_one_instance_and_a_file_that_is_not_one(fleet, tmp_path, capsys):
    segments, curves = fleet
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main([*RECOMMEND, "--trace", str(segments), "--out", str(tmp_path / "x"),
                 "--live-curves", str(bad)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kvtier recommend: error: --live-curves: {bad}: not a live curve file")
    assert main([*RECOMMEND, "--trace", str(segments), "--out", str(tmp_path / "y"),
                 "--live-curves", str(tmp_path / "none")]) == 2
    assert "no live curve file there" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before any work
    assert main([*RECOMMEND, "--trace", str(segments), "--instance", "node-b",
                 "--out", str(tmp_path / "b"), "--live-curves", str(curves)]) == 0
    out = capsys.readouterr().out
    assert "live curve of reference/node-b" in out and "vllm/node-a" not in out
