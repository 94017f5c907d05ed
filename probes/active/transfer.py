"""The transfer probe: copy latency and bandwidth between host memory and the device, by size.

On a CUDA machine it times host->device (the promotion direction) and device->host (the store
direction) for pinned and for pageable host buffers. Without an accelerator the "GPU" tier is
process memory, so it times host->host copies: that is the engine's real promotion cost there.
Each copy is timed alone, after waiting for the device, so a time covers the whole transfer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from kvtier.probes.active.stats import LinearFit, fit_latency, percentiles

DEFAULT_SIZES = (16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)


@dataclass(frozen=True)
class TransferConfig:
    sizes_bytes: tuple[int, ...] = DEFAULT_SIZES
    repeats: int = 20
    warmup: int = 2

    def __post_init__(self) -> None:
        if not self.sizes_bytes or any(not isinstance(s, int) or s <= 0 for s in self.sizes_bytes):
            raise ValueError(f"sizes_bytes must be positive ints, got {self.sizes_bytes!r}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {self.repeats}, {self.warmup}")


@dataclass(frozen=True)
class TransferRow:
    direction: str  # host_to_device | device_to_host | host_to_host
    host_memory: str  # pinned | pageable
    size_bytes: int
    p50_latency_s: float
    p99_latency_s: float
    bandwidth_bytes_per_s: float  # size / median latency

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class TransferResult:
    device: str
    accelerator: bool
    torch_threads: int  # intra-op threads: on a busy host, >1 can stall copies for a time slice
    rows: tuple[TransferRow, ...]
    fits: tuple[tuple[str, LinearFit], ...]  # "direction/host_memory" -> fit

    def fit(self, direction: str, host_memory: str) -> LinearFit:
        return dict(self.fits)[f"{direction}/{host_memory}"]

    def cost_params(self) -> dict[str, float]:
        """The cost model's CPU<->GPU parameters: the promotion path (pinned host->device on
        an accelerator, the host copy without one)."""
        fit = self.fit("host_to_device", "pinned") if self.accelerator else self.fit("host_to_host", "pageable")
        return {"cpu_gpu_bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
                "cpu_gpu_op_latency_s": fit.op_latency_s}

    def to_dict(self) -> dict:
        return {"probe": "transfer", "device": self.device, "accelerator": self.accelerator,
                "torch_threads": self.torch_threads,
                "rows": [r.to_dict() for r in self.rows],
                "fits": {k: f.to_dict() for k, f in self.fits}, "cost_params": self.cost_params()}


def run_transfer(config: TransferConfig = TransferConfig(), *,
                 timer: Callable[[], float] = time.perf_counter,
                 progress: Callable[[str], None] = lambda line: None) -> TransferResult:
    import torch

    accelerator = torch.cuda.is_available()
    if accelerator:
        device = torch.device("cuda")
        paths = [("host_to_device", "pinned"), ("device_to_host", "pinned"),
                 ("host_to_device", "pageable"), ("device_to_host", "pageable")]
        name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        paths = [("host_to_host", "pageable")]
        name = "cpu (no accelerator: the GPU tier is process memory; host memory copies)"
    rows = []
    for direction, memory in paths:
        for size in config.sizes_bytes:
            progress(f"transfer {direction} {memory} {size} bytes")
            times = _time_copies(torch, device, direction, memory, size, config, timer)
            p = percentiles(times, (50, 99))
            rows.append(TransferRow(direction, memory, size, p["p50"], p["p99"], size / p["p50"]))
    fits = tuple((f"{d}/{m}", fit_latency([r.size_bytes for r in rows if (r.direction, r.host_memory) == (d, m)],
                                          [r.p50_latency_s for r in rows if (r.direction, r.host_memory) == (d, m)]))
                 for d, m in paths)
    return TransferResult(name, accelerator, torch.get_num_threads(), tuple(rows), fits)


def _time_copies(torch, device, direction, memory, size, config, timer) -> list[float]:
    host = torch.ones(size, dtype=torch.uint8, pin_memory=memory == "pinned")
    other = torch.zeros(size, dtype=torch.uint8, device=device)
    src, dst = (other, host) if direction == "device_to_host" else (host, other)
    times = []
    for i in range(config.warmup + config.repeats):
        _sync(torch, device)
        start = timer()
        dst.copy_(src, non_blocking=memory == "pinned")
        _sync(torch, device)
        if i >= config.warmup:
            times.append(max(timer() - start, 1e-9))
    return times


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
