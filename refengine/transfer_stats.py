"""Bytes and seconds moved between tiers, summed since the engine started (for /metrics).

Kinds follow vLLM's offloading metrics: ``load`` (CPU -> GPU), ``store`` (GPU -> CPU),
``tier_read`` (file -> CPU) and ``tier_write`` (CPU -> file). Updated from the engine thread
and the file tier's writer threads, so a lock guards the sums.
"""

from __future__ import annotations

import threading

KINDS = ("load", "store", "tier_read", "tier_write")


class TransferStats:
    def __init__(self):
        self._lock = threading.Lock()
        self._sums = {kind: [0, 0.0] for kind in KINDS}

    def add(self, kind: str, size_bytes: int, seconds: float) -> None:
        with self._lock:
            total = self._sums[kind]
            total[0] += size_bytes
            total[1] += seconds

    def snapshot(self) -> dict[str, tuple[int, float]]:
        """``{kind: (bytes, seconds)}``."""
        with self._lock:
            return {kind: (b, s) for kind, (b, s) in self._sums.items()}
