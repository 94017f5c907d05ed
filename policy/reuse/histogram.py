"""A log-binned histogram: constant memory percentiles for long traces."""

from __future__ import annotations

import math

BINS_PER_DECADE = 40  # bin edges 10**(k/40): about 6% relative resolution
SMALLEST_S = 1e-3


class LogHistogram:
    """Counts of non-negative values in log-spaced bins; values below 1 ms share bin 0."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0

    def add(self, value: float, weight: int = 1) -> None:
        index = 0 if value < SMALLEST_S else 1 + int(BINS_PER_DECADE * math.log10(value / SMALLEST_S))
        self.counts[index] = self.counts.get(index, 0) + weight
        self.total += weight

    def add_many(self, values) -> None:
        """:meth:`add` for every value of a numpy array, binned in one vectorised pass."""
        import numpy as np

        values = np.asarray(values, dtype=float)
        if not len(values):
            return
        small = values < SMALLEST_S
        scaled = np.where(small, SMALLEST_S, values) / SMALLEST_S
        index = np.where(small, 0, 1 + (BINS_PER_DECADE * np.log10(scaled)).astype(np.int64))
        bins, counts = np.unique(index, return_counts=True)
        for b, c in zip(bins.tolist(), counts.tolist()):
            self.counts[b] = self.counts.get(b, 0) + c
        self.total += len(values)

    def merge(self, other: LogHistogram) -> None:
        for index, count in other.counts.items():
            self.counts[index] = self.counts.get(index, 0) + count
        self.total += other.total

    def quantile(self, q: float) -> float | None:
        """Upper edge of the bin holding the q-quantile; ``None`` when empty."""
        if not 0 <= q <= 1:
            raise ValueError(f"q must be in [0, 1], got {q}")
        if not self.total:
            return None
        target = q * self.total
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= target:
                return _upper_edge(index)
        return _upper_edge(max(self.counts))

    def fraction_at_most(self, value: float) -> float:
        """Share of the weight in bins whose upper edge is at most ``value``."""
        if not self.total:
            return 0.0
        inside = sum(c for i, c in self.counts.items() if _upper_edge(i) <= value * (1 + 1e-9))
        return inside / self.total

    def summary(self) -> dict:
        return {"count": self.total, **{f"p{int(q * 100)}_s": self.quantile(q)
                                        for q in (0.5, 0.9, 0.99)}}


def _upper_edge(index: int) -> float:
    return SMALLEST_S * 10 ** (index / BINS_PER_DECADE)
