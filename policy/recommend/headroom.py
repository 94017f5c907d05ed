"""The host memory a recommended CPU tier may take: a cap from measured headroom.

Two sources: ``kvtier probe headroom --json`` (its ``safe_bytes`` already keeps the probe's
margin and reserve free, both stated in its output) or a figure the operator gives
(``--host-headroom-bytes``), from which kvtier keeps ``SAFETY_MARGIN_FRACTION`` of it, and
at least ``SAFETY_MARGIN_MIN_BYTES``, free: the same margin rule as the probe's defaults.
Every engine's host size (vLLM ``cpu_bytes_to_use``, TRT-LLM ``host_cache_size``, LMCache
``max_local_cpu_size``, SGLang ``--hicache-size``, Dynamo ``DYN_KVBM_CPU_CACHE_GB``) is
written from ``cpu_tier_bytes``, so one cap on it caps them all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvtier.policy.recommend.values import HostCheck

SAFETY_MARGIN_FRACTION = 0.10
SAFETY_MARGIN_MIN_BYTES = 1 << 30


@dataclass(frozen=True)
class HostLimit:
    """``headroom_bytes`` measured or given, ``margin_bytes`` kept free on top of it, and
    where the figure came from; ``cap_bytes`` is what a CPU tier may take."""

    headroom_bytes: int
    margin_bytes: int
    source: str

    def __post_init__(self) -> None:
        for name in ("headroom_bytes", "margin_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")

    @property
    def cap_bytes(self) -> int:
        return max(self.headroom_bytes - self.margin_bytes, 0)

    def cap_blocks(self, block_bytes: int) -> int:
        """Whole KV blocks of ``block_bytes`` that fit under the cap."""
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {block_bytes!r}")
        return self.cap_bytes // block_bytes

    def check(self, requested_bytes: int, recommended_bytes: int) -> HostCheck:
        """The evidence: this cap applied to a CPU tier asked at ``requested_bytes``."""
        return HostCheck(True, source=self.source, headroom_bytes=self.headroom_bytes,
                         safety_margin_bytes=self.margin_bytes, cap_bytes=self.cap_bytes,
                         requested_cpu_bytes=requested_bytes,
                         recommended_cpu_bytes=recommended_bytes,
                         capped=recommended_bytes < requested_bytes)


NOT_CHECKED = HostCheck(False, why="no --host-headroom-bytes or --headroom-json was given, and "
                                   "this host's memory could not be measured")


def from_bytes(headroom_bytes: int) -> HostLimit:
    """A headroom the operator states; kvtier keeps its own margin free."""
    if isinstance(headroom_bytes, bool) or not isinstance(headroom_bytes, int) or headroom_bytes < 0:
        raise ValueError(f"--host-headroom-bytes must be an int >= 0, got {headroom_bytes!r}")
    margin = max(int(SAFETY_MARGIN_FRACTION * headroom_bytes), SAFETY_MARGIN_MIN_BYTES)
    return HostLimit(headroom_bytes, margin,
                     f"--host-headroom-bytes, less a safety margin of "
                     f"max({SAFETY_MARGIN_FRACTION:.0%}, {SAFETY_MARGIN_MIN_BYTES >> 30} GiB)")


def from_probe_json(path: str | Path) -> HostLimit:
    """The probe's JSON: ``available_bytes`` less its ``margin_bytes`` and ``reserve_bytes``
    (that is its ``safe_bytes``)."""
    try:
        body = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON: {error}") from None
    if not isinstance(body, dict) or body.get("probe") != "headroom":
        raise ValueError(f"{path} is not the output of `kvtier probe headroom --json`")
    try:
        available, margin, reserve, safe = (int(body[k]) for k in (
            "available_bytes", "margin_bytes", "reserve_bytes", "safe_bytes"))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: headroom probe output lacks a byte count ({error})") from None
    limit = HostLimit(available, margin + reserve,
                      f"kvtier probe headroom ({path}; limited by {body.get('limited_by')}; "
                      f"margin {margin} + reserve {reserve} bytes)")
    if limit.cap_bytes != safe:
        raise ValueError(f"{path}: safe_bytes {safe} != available - margin - reserve "
                         f"({limit.cap_bytes}); not a headroom probe result kvtier understands")
    return limit
