"""Small statistics shared by the probes: percentiles and the latency = a + bytes/b fit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float | None]:
    """``{"p50": ..., ...}`` by linear interpolation (numpy's default, DuckDB's
    ``quantile_cont``); ``None`` for no values."""
    data = np.asarray([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        return {f"p{q:g}": None for q in qs}
    return {f"p{q:g}": float(np.percentile(data, q)) for q in qs}


@dataclass(frozen=True)
class LinearFit:
    """``latency_s = op_latency_s + size_bytes / bandwidth_bytes_per_s`` over measured points."""

    op_latency_s: float
    bandwidth_bytes_per_s: float
    points: int

    def to_dict(self) -> dict:
        return {"op_latency_s": self.op_latency_s, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "points": self.points}


def fit_latency(sizes_bytes: Sequence[int], latencies_s: Sequence[float]) -> LinearFit:
    """Least squares over the points. When the fit is not physical (a negative intercept or
    slope, as noise at tiny sizes can give), fall back to the smallest size's latency as the
    fixed cost and the largest size's rate as the bandwidth."""
    sizes = np.asarray(sizes_bytes, dtype=float)
    lat = np.asarray(latencies_s, dtype=float)
    if sizes.size >= 2 and np.ptp(sizes) > 0:
        slope, intercept = np.polyfit(sizes, lat, 1)
        if slope > 0 and intercept > 0:
            return LinearFit(float(intercept), float(1 / slope), int(sizes.size))
    small, large = int(np.argmin(sizes)), int(np.argmax(sizes))
    op = max(float(lat[small]), 1e-9)
    return LinearFit(op, float(sizes[large] / max(lat[large], 1e-12)), int(sizes.size))


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"64KiB,1MiB,4096"`` -> bytes; ``ValueError`` naming a bad item."""
    units = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20, "mib": 1 << 20,
             "mb": 1000**2, "g": 1 << 30, "gib": 1 << 30, "gb": 1000**3}
    out = []
    for item in text.split(","):
        raw = item.strip().lower()
        number = raw.rstrip("kmgib")
        unit = raw[len(number):]
        try:
            value = int(float(number) * units[unit])
        except (ValueError, KeyError):
            raise ValueError(f"bad size {item.strip()!r}; use bytes or e.g. 64KiB, 4MiB, 1GiB") from None
        if value <= 0:
            raise ValueError(f"sizes must be > 0, got {item.strip()!r}")
        out.append(value)
    return tuple(out)
