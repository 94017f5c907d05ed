"""Headroom from fake /proc and /sys trees: page cache counts, cgroup limits bind, margins hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.probes.active.headroom import GIB, HeadroomConfig, measure_headroom


def write(root: Path, path: str, text: str) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def host(root: Path, total_gib=24, free_gib=2, available_gib=20) -> None:
    kib = 1 << 20
    write(root, "proc/meminfo", f"MemTotal: {total_gib * kib} kB\nMemFree: {free_gib * kib} kB\n"
                                f"MemAvailable: {available_gib * kib} kB\nCached: {15 * kib} kB\n"
                                f"Buffers: 0 kB\nSwapFree: {8 * kib} kB\n")


def v2(root: Path, path: str, limits: dict[str, str], usage: int, inactive: int) -> None:
    write(root, "proc/self/cgroup", f"0::{path}\n")
    write(root, "sys/fs/cgroup/cgroup.controllers", "cpu memory\n")
    for folder, limit in limits.items():
        write(root, f"sys/fs/cgroup/{folder}/memory.max", limit + "\n")
    write(root, f"sys/fs/cgroup{path}/memory.current", f"{usage}\n")
    write(root, f"sys/fs/cgroup{path}/memory.stat", f"anon 1\ninactive_file {inactive}\n")


def test_page_cache_counts_not_just_free_memory(tmp_path):
    host(tmp_path, free_gib=2, available_gib=20)
    result = measure_headroom(HeadroomConfig(root=str(tmp_path)))
    assert result.limited_by == "host" and result.cgroup is None
    assert result.margin_bytes == int(0.1 * 24 * GIB)
    assert result.safe_bytes == 20 * GIB - int(0.1 * 24 * GIB) > result.mem_free_bytes


def test_a_cgroup_limit_binds_by_its_working_set(tmp_path):
    host(tmp_path)
    v2(tmp_path, "/kubepods/pod1", {"kubepods/pod1": str(8 * GIB)}, usage=6 * GIB, inactive=2 * GIB)
    result = measure_headroom(HeadroomConfig(root=str(tmp_path)))
    assert result.limited_by == "cgroup" and result.cgroup.version == 2
    assert result.available_bytes == 4 * GIB  # 8 GiB limit - (6 - 2) GiB working set
    assert result.safe_bytes == 3 * GIB  # margin: max(10% of 8 GiB, 1 GiB)


def test_a_parents_smaller_limit_is_the_effective_one(tmp_path):
    host(tmp_path)
    v2(tmp_path, "/a/b", {"a": str(4 * GIB), "a/b": "max"}, usage=GIB, inactive=0)
    result = measure_headroom(HeadroomConfig(root=str(tmp_path), margin_min_bytes=0, margin_fraction=0.0))
    assert result.cgroup.limit_bytes == 4 * GIB and result.safe_bytes == 3 * GIB


def test_cgroup_v1_unlimited_falls_back_to_the_host(tmp_path):
    host(tmp_path)
    write(tmp_path, "proc/self/cgroup", "4:memory:/docker/x\n0::/\n")
    for name, value in (("memory.limit_in_bytes", "9223372036854771712"), ("memory.usage_in_bytes", str(GIB))):
        write(tmp_path, f"sys/fs/cgroup/memory/docker/x/{name}", value)
    write(tmp_path, "sys/fs/cgroup/memory/docker/x/memory.stat", "total_inactive_file 5\n")
    result = measure_headroom(HeadroomConfig(root=str(tmp_path)))
    assert result.cgroup.version == 1 and result.cgroup.limit_bytes is None
    assert result.limited_by == "host"


def test_reserve_and_margin_never_make_headroom_negative(tmp_path):
    host(tmp_path, available_gib=1)
    result = measure_headroom(HeadroomConfig(root=str(tmp_path), reserve_bytes=5 * GIB))
    assert result.safe_bytes == 0 and result.blocks(4096) == 0


def test_this_machine_gives_a_bounded_answer():
    result = measure_headroom()
    assert 0 <= result.safe_bytes < result.mem_total_bytes


@pytest.mark.parametrize("field, value", [("margin_fraction", 1.5), ("reserve_bytes", -1)])
def test_bad_config_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        HeadroomConfig(**{field: value})
