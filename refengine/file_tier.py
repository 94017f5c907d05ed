"""The file (cold) tier: one file per block, read and written by a thread pool.

A block is written to ``<hash>.kv.tmp`` and renamed to ``<hash>.kv`` (``os.replace`` is
atomic), so a killed engine leaves no half-written block under a block's name; leftover
``.tmp`` files are removed when a tier opens the folder. A write is asynchronous: ``put``
returns a future, and a read or eviction of that block waits for it first. The tier starts
empty: files from an earlier run are removed, since nothing says which weights made them.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from kvtier.refengine.eviction import EvictionOrder

SUFFIX, TMP_SUFFIX = ".kv", ".kv.tmp"


class FileTier:
    """``on_stored(hash, size_bytes, latency_s)`` runs on a pool thread after each write."""

    def __init__(self, folder: str | Path, num_blocks: int, block_shape: tuple[int, ...], dtype,
                 policy: str, threads: int,
                 on_stored: Callable[[int, int, float], None] = lambda h, n, s: None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in [*self.folder.glob("*" + TMP_SUFFIX), *self.folder.glob("*" + SUFFIX)]:
            stale.unlink(missing_ok=True)
        self.num_blocks = num_blocks
        self._shape, self._dtype = block_shape, dtype
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kvtier-file-tier")
        self._writes: dict[int, Future] = {}
        self._order = EvictionOrder(policy)
        self._on_stored = on_stored
        self.write_failures = 0

    def path(self, block_hash: int) -> Path:
        return self.folder / f"{block_hash:016x}{SUFFIX}"

    def __contains__(self, block_hash: int) -> bool:
        future = self._writes.get(block_hash)
        if future is not None and future.done():
            self._wait(block_hash)  # settles a failed write: the block is not here
        return block_hash in self._order

    @property
    def is_full(self) -> bool:
        return len(self._order) >= self.num_blocks

    @property
    def hashes(self) -> list[int]:
        return list(self._order)

    def victim(self, protected: set[int] = frozenset()) -> int | None:
        """The block eviction would remove next, skipping ``protected`` ones."""
        return self._order.victim(lambda h: h not in protected)

    def put(self, block_hash: int, block: torch.Tensor) -> Future:
        """Start writing a copy of ``block``; the tier must not be full."""
        if self.is_full:
            raise RuntimeError("FileTier.put on a full tier: evict a victim first")
        data = block.detach().to("cpu", copy=True).numpy().tobytes()
        self._order.add(block_hash)
        future = self._pool.submit(self._write, block_hash, data)
        self._writes[block_hash] = future
        return future

    def _write(self, block_hash: int, data: bytes) -> None:
        start = time.perf_counter()
        final = self.path(block_hash)
        tmp = final.with_name(final.name[:-len(SUFFIX)] + TMP_SUFFIX)
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._on_stored(block_hash, len(data), time.perf_counter() - start)

    def read_many(self, block_hashes: list[int]) -> list[torch.Tensor]:
        """Read blocks in parallel on the pool; each touches the eviction order.
        ``KeyError`` if a block is not in the tier (check with ``in`` first)."""
        for block_hash in block_hashes:
            self._wait(block_hash)
            if block_hash not in self._order:
                raise KeyError(f"block {block_hash:016x} is not in the file tier")
            self._order.touch(block_hash)
        return list(self._pool.map(self._read, block_hashes))

    def _read(self, block_hash: int) -> torch.Tensor:
        array = np.fromfile(self.path(block_hash), dtype=np.dtype(str(self._dtype).removeprefix("torch.")))
        return torch.from_numpy(array).view(self._shape)

    def remove(self, block_hash: int) -> None:
        self._wait(block_hash)
        self._order.remove(block_hash)
        self.path(block_hash).unlink(missing_ok=True)

    def _wait(self, block_hash: int) -> None:
        """Wait for the block's write; a failed write (disk full...) forgets the block."""
        future = self._writes.pop(block_hash, None)
        if future is not None and future.exception() is not None:
            self.write_failures += 1
            self._order.remove(block_hash)

    def flush(self) -> None:
        """Wait for every pending write."""
        for block_hash in list(self._writes):
            self._wait(block_hash)

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)
