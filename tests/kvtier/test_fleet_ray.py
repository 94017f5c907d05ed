"""A fleet's analyses on Ray: `simulate`, `evaluate` and `recommend --ray ADDRESS` over the
segments of four instances, on a local cluster of two nodes (a head and a second node
process, one CPU each), give the local run's output for every instance; the cluster stops
cleanly, leaving nothing of its own running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.cli import main
from tests.kvtier.fleet_segments import fleet_segments
from tests.kvtier.ray_cluster import LocalRayCluster

ray = pytest.importorskip("ray", reason="Ray is an optional dependency (pip install 'kvtier[ray]')")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
INSTANCES = ("node-a", "node-b", "node-c", "node-d")


@pytest.fixture(scope="module")
def segments(tmp_path_factory):
    return fleet_segments(tmp_path_factory.mktemp("fleet"), INSTANCES, max_requests=2000)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    with LocalRayCluster(root) as running:
        yield running.address
    assert not _processes_under(root / "ray"), "the cluster left processes running"


def _processes_under(folder: Path) -> list[int]:
    """Processes whose command line names ``folder`` (the cluster's own files)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(folder) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def run_json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_and_evaluate_on_ray_equal_the_local_run(segments, cluster, capsys):
    for verb in (["simulate", "--gpu-tokens", "200k", "--cpu-tokens", "1M"],
                 ["evaluate", "--gpu-tokens", "200k", "--cpu-tokens", "500k", "--policies",
                  "lru,belady", "--split", "requests"]):
        argv = [*verb, "--trace", str(segments), "--json"]
        local = run_json(capsys, [*argv, "--jobs", "1"])
        on_ray = run_json(capsys, [*argv, "--ray", cluster])
        assert on_ray == local
        assert [p["instance"] for p in on_ray["instances"]] == list(INSTANCES)


def test_recommend_on_ray_writes_the_local_recommendation_of_every_instance(segments, cluster,
                                                                              tmp_path, capsys):
    outs = {}
    for how, flags in (("local", ["--jobs", "2"]), ("ray", ["--ray", cluster])):
        out = tmp_path / how
        assert main(["recommend", "--trace", str(segments), "--gpu-tokens", "200k",
                     "--cpu-tokens", "1M", "--engine", "vllm", "--out", str(out),
                     "--host-headroom-bytes", str(64 << 30), *flags]) == 0
        outs[how] = json.loads((out / "fleet.json").read_text())
        for name in INSTANCES:
            assert (out / f"instance={name}" / "recommendation.json").exists()
    strip = lambda index: [{k: v for k, v in p.items() if k != "out"} for p in index["instances"]]
    assert strip(outs["ray"]) == strip(outs["local"])
    assert "Ray)" in capsys.readouterr().err  # each instance's progress line says where it ran
