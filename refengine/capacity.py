"""Whether tier capacities fit the machine: a check before any tensor is allocated.

The GPU tier lives on the compute device (CUDA memory, or process memory standing in for it),
the CPU tier in host memory, the cold tier in files under ``file_dir``; each is compared with
what that memory or disk has free now. Capacities freed by a tier switch (the caches restart
empty) count as free. The error names the field (``gpu_blocks``, ``cpu_blocks``,
``cold_blocks``) so the command line and the admin API can name their own.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def host_available_bytes() -> int:
    """Host memory a new allocation can take: ``MemAvailable`` of ``/proc/meminfo``, else the
    free physical pages ``os.sysconf`` reports."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_available_bytes(device) -> int:
    """Free memory of the compute device (host memory when it is the CPU)."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    return host_available_bytes()


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def disk_available_bytes(folder: str | Path) -> int:
    """Free bytes of the filesystem ``folder`` is (or would be created) on."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_tiers_fit(tiers, block_bytes: int, device, *, held=None, file_dir=None) -> None:
    """``ValueError`` naming the field if ``tiers`` (a ``TierConfig``) cannot be allocated.

    ``held`` is the ``TierConfig`` whose memory is released before ``tiers`` is allocated
    (a switch); ``None`` when nothing is allocated yet. On a CPU-only machine both tiers
    share host memory, so their sum is compared with it.
    """
    on_host = getattr(device, "type", "cpu") != "cuda"
    held_gpu = held.gpu_blocks * block_bytes if held is not None else 0
    held_cpu = held.cpu_blocks * block_bytes if held is not None else 0
    host_free = host_available_bytes() + held_cpu + (held_gpu if on_host else 0)
    gpu_bytes, cpu_bytes = tiers.gpu_blocks * block_bytes, tiers.cpu_blocks * block_bytes
    if on_host:
        _fits("gpu_blocks", tiers.gpu_blocks, gpu_bytes, block_bytes, host_free, "this host has")
        _fits("cpu_blocks", tiers.cpu_blocks, cpu_bytes, block_bytes, host_free - gpu_bytes,
              "this host has, after the GPU tier's share,")
    else:
        device_free = device_available_bytes(device) + held_gpu
        _fits("gpu_blocks", tiers.gpu_blocks, gpu_bytes, block_bytes, device_free, f"{device} has")
        _fits("cpu_blocks", tiers.cpu_blocks, cpu_bytes, block_bytes, host_free, "this host has")
    if tiers.cold_blocks and file_dir is not None:  # the tier's old files are removed first
        disk_free = disk_available_bytes(file_dir) + (held.cold_blocks * block_bytes if held else 0)
        _fits("cold_blocks", tiers.cold_blocks, tiers.cold_blocks * block_bytes, block_bytes,
              disk_free, f"the disk of {file_dir} has")


def _fits(field: str, blocks: int, need: int, block_bytes: int, free: int, where: str) -> None:
    if need > free:
        raise ValueError(f"{field}={blocks} needs {human_bytes(need)} ({block_bytes} bytes a block); "
                         f"{where} {human_bytes(max(free, 0))} available")
