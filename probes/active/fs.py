"""The file-tier probe: write and read throughput and latency by block size and thread count.

It does what the engine's file tier does (one file per block, written to a temporary name and
renamed; read whole) in a folder on the filesystem to measure. Reads and writes use
``O_DIRECT`` when the filesystem accepts it, so reads come from the device and not from the
page cache; where it does not (tmpfs, some overlay filesystems) the probe says so and uses
buffered I/O, whose reads a warm page cache may serve. Files are removed afterwards.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvtier.probes.active.stats import LinearFit, fit_latency, percentiles

DIRECT_MODES = ("auto", "on", "off")
ALIGN_BYTES = 4096


@dataclass(frozen=True)
class FsConfig:
    folder: str
    sizes_bytes: tuple[int, ...] = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
    threads: tuple[int, ...] = (1, 4)
    blocks: int = 32  # files per (size, threads) point
    direct: str = "auto"

    def __post_init__(self) -> None:
        if self.direct not in DIRECT_MODES:
            raise ValueError(f"unknown direct mode {self.direct!r}; allowed: {', '.join(DIRECT_MODES)}")
        if not self.sizes_bytes or any(s <= 0 or s % ALIGN_BYTES for s in self.sizes_bytes):
            raise ValueError(f"sizes_bytes must be positive multiples of {ALIGN_BYTES} (O_DIRECT "
                             f"alignment), got {self.sizes_bytes!r}")
        if not self.threads or any(t < 1 for t in self.threads) or self.blocks < 1:
            raise ValueError(f"threads and blocks must be >= 1, got {self.threads!r}, {self.blocks!r}")


@dataclass(frozen=True)
class FsRow:
    op: str  # write | read
    size_bytes: int
    threads: int
    p50_latency_s: float
    p99_latency_s: float
    throughput_bytes_per_s: float  # all bytes / wall time of the point

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class FsResult:
    folder: str
    direct: bool
    direct_note: str
    rows: tuple[FsRow, ...]
    read_fit: LinearFit  # single-thread reads

    def cost_params(self) -> dict[str, float]:
        """The cost model's cold->CPU parameters: the fixed cost per read from one thread,
        and the best aggregate read throughput (the engine reads a request's blocks in parallel)."""
        best = max(r.throughput_bytes_per_s for r in self.rows if r.op == "read")
        return {"cold_cpu_bandwidth_bytes_per_s": best, "cold_cpu_op_latency_s": self.read_fit.op_latency_s}

    def to_dict(self) -> dict:
        return {"probe": "fs", "folder": self.folder, "direct": self.direct, "direct_note": self.direct_note,
                "rows": [r.to_dict() for r in self.rows], "read_fit": self.read_fit.to_dict(),
                "cost_params": self.cost_params()}


def direct_supported(folder: Path) -> tuple[bool, str]:
    """Try an aligned O_DIRECT write in ``folder``; ``(ok, why)``."""
    if not hasattr(os, "O_DIRECT"):
        return False, "O_DIRECT is not available on this platform; buffered I/O"
    path = folder / f".kvtier-direct-{uuid.uuid4().hex}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
        try:
            os.pwritev(fd, [mmap.mmap(-1, ALIGN_BYTES)], 0)
        finally:
            os.close(fd)
        return True, "O_DIRECT: reads and writes bypass the page cache"
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        return False, (f"the filesystem refused O_DIRECT ({errno.errorcode[error.errno]}); buffered "
                       "I/O, so reads may be served from the page cache and look faster than the device")
    finally:
        path.unlink(missing_ok=True)


def run_fs(config: FsConfig, *, timer: Callable[[], float] = time.perf_counter,
           progress: Callable[[str], None] = lambda line: None) -> FsResult:
    folder = Path(config.folder) / f"kvtier-fs-probe-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    try:
        direct, note = _direct_mode(config.direct, folder)
        rows = []
        for size in config.sizes_bytes:
            for threads in config.threads:
                progress(f"fs {size} bytes x {config.blocks} files, {threads} threads")
                rows.extend(_point(folder, size, threads, config.blocks, direct, timer))
        singles = [r for r in rows if r.op == "read" and r.threads == min(config.threads)]
        fit = fit_latency([r.size_bytes for r in singles], [r.p50_latency_s for r in singles])
        return FsResult(str(Path(config.folder).resolve()), direct, note, tuple(rows), fit)
    finally:
        for path in folder.iterdir():
            path.unlink(missing_ok=True)
        folder.rmdir()


def _direct_mode(mode: str, folder: Path) -> tuple[bool, str]:
    if mode == "off":
        return False, "buffered I/O (asked for: --direct off)"
    ok, note = direct_supported(folder)
    if mode == "on" and not ok:
        raise ValueError(f"--direct on, but {note}")
    return ok, note


def _point(folder: Path, size: int, threads: int, blocks: int, direct: bool, timer) -> list[FsRow]:
    paths = [folder / f"{size}-{threads}-{i}.kv" for i in range(blocks)]
    out = []
    for op, work in (("write", _write), ("read", _read)):
        with ThreadPoolExecutor(threads) as pool:
            start = timer()
            times = list(pool.map(work, paths, [size] * blocks, [direct] * blocks, [timer] * blocks))
            wall = max(timer() - start, 1e-9)
        p = percentiles(times, (50, 99))
        out.append(FsRow(op, size, threads, p["p50"], p["p99"], size * blocks / wall))
    for path in paths:
        path.unlink(missing_ok=True)
    return out


def _flags(direct: bool) -> int:
    return os.O_DIRECT if direct else 0


def _write(path: Path, size: int, direct: bool, timer) -> float:
    buffer = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
    buffer.write(os.urandom(min(size, 1 << 16)) * (size // min(size, 1 << 16)))
    tmp = path.with_suffix(".tmp")
    start = timer()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _flags(direct), 0o600)
    try:
        os.pwritev(fd, [buffer], 0)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return max(timer() - start, 1e-9)


def _read(path: Path, size: int, direct: bool, timer) -> float:
    buffer = mmap.mmap(-1, size)
    start = timer()
    fd = os.open(path, os.O_RDONLY | _flags(direct))
    try:
        got = os.preadv(fd, [buffer], 0)
    finally:
        os.close(fd)
    elapsed = max(timer() - start, 1e-9)
    if got != size:
        raise OSError(f"short read of {path}: {got} of {size} bytes")
    return elapsed
