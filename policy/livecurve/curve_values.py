"""The live curves as values: what the collector exports, writes beside its segments and what
``kvtier recommend --live-curves`` and the dashboard read back. Standard library only.

The collector writes one file per collector, ``SEGMENTS/live_curves/collector=NAME.json``
(atomically, at each segment export and at stop), so the collectors of a fleet can share one
segment folder; :func:`read_live_curves` reads one file or every file under a folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

FOLDER = "live_curves"  # under a segment folder
ALL = "all"  # the window since the collector started


@dataclass(frozen=True)
class CurvePoint:
    """The token hit ratio (every tier together) with the ``tier`` at ``size_tokens``: the
    CPU ladder with no file tier, or the file ladder under the configured CPU size.
    ``saved_prefill_s_per_gib``: prefill seconds saved per second of traffic by each GiB
    from the ladder's size below to this one (a share of one prefill server per GiB;
    ``None`` without a cost file, or for the first size)."""

    tier: str
    size_tokens: int
    size_bytes: int
    hit_ratio: float
    hit_tokens: int
    saved_prefill_s_per_gib: float | None = None


@dataclass(frozen=True)
class Reach:
    """The CPU-tier size (beyond the GPU) that serves ``percent`` % of the hits a CPU tier up
    to the largest size tracked would add; ``size_tokens`` is a bin's upper edge (bins are
    1/16 of an octave, so it is at most 4.4% above the exact size)."""

    percent: int
    size_tokens: int
    size_bytes: int


@dataclass(frozen=True)
class WindowCurve:
    """One window of one instance: ``window`` is ``"300s"``-style or ``"all"``."""

    window: str
    span_s: float
    requests: int
    prompt_tokens: int
    gpu_hit_ratio: float
    points: tuple[CurvePoint, ...]
    reach: tuple[Reach, ...]
    reachable_cpu_hit_tokens: int

    def point(self, tier: str, size_tokens: int) -> CurvePoint | None:
        return next((p for p in self.points if p.tier == tier and p.size_tokens == size_tokens),
                    None)


@dataclass(frozen=True)
class Headroom:
    """The tier-aware load signal: prompt tokens each tier served per second (measured, the
    engine's own split), the prefill servers' busy share under the cost model, and the factor
    the arrival rate could grow by before the p99 TTFT passes ``ttft_budget_s`` (below 1: it
    already passes it), with the tiers as they serve and with the offload tiers' tokens
    recomputed. ``costs`` says what the cost model rests on: ``calibrated`` (a cost file) or
    ``default`` (kvtier's documented assumptions)."""

    ttft_budget_s: float
    costs: str
    requests: int
    span_s: float
    saved_tokens_per_s: dict = field(default_factory=dict)  # tier -> tokens per second
    recomputed_tokens_per_s: float = 0.0
    utilisation: float = 0.0
    load_factor: float = 0.0
    load_factor_without_offload: float = 0.0


@dataclass(frozen=True)
class InstanceCurves:
    """Every window of one (engine, instance). ``gpu_source``/``kv_bytes_source`` say where
    the GPU size and the KV bytes per token came from; ``note`` why there is no curve yet."""

    engine: str
    instance: str
    semantics: str
    gpu_tokens: int | None
    gpu_source: str
    block_tokens: int | None
    kv_bytes_per_token: int | None
    kv_bytes_source: str
    tracked_blocks: int = 0
    memory_bytes: int = 0
    windows: tuple[WindowCurve, ...] = ()
    headroom: Headroom | None = None
    note: str = ""
    unsized_requests: int = 0  # requests not counted while the GPU size was unknown

    def window(self, name: str) -> WindowCurve | None:
        return next((w for w in self.windows if w.window == name), None)


@dataclass(frozen=True)
class CurveFile:
    collector: str
    time_s: float
    instances: tuple[InstanceCurves, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "CurveFile":
        body = json.loads(text)
        return cls(body["collector"], float(body["time_s"]),
                   tuple(_instance(i) for i in body["instances"]))


def _instance(body: dict) -> InstanceCurves:
    windows = tuple(WindowCurve(**{**w, "points": tuple(CurvePoint(**p) for p in w["points"]),
                                   "reach": tuple(Reach(**r) for r in w["reach"])})
                    for w in body.get("windows", ()))
    headroom = Headroom(**body["headroom"]) if body.get("headroom") else None
    return InstanceCurves(**{**body, "windows": windows, "headroom": headroom})


def curve_file_path(segments: Path, collector: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in collector)
    return Path(segments) / FOLDER / f"collector={safe}.json"


def write_curve_file(segments: Path, curves: CurveFile) -> Path:
    """Write ``curves`` under ``segments`` atomically (a reader never sees half a file)."""
    path = curve_file_path(segments, curves.collector)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(curves.to_json())
    os.replace(part, path)
    return path


def read_live_curves(path: str | Path) -> tuple[InstanceCurves, ...]:
    """Every instance's curves in a curve file, or in the files under a folder (a segment
    folder's ``live_curves/``, or that folder itself), by engine and instance. ``ValueError``
    naming the file that is not a curve file; ``FileNotFoundError`` when there is none."""
    path = Path(path)
    if path.is_dir():
        folder = path / FOLDER if (path / FOLDER).is_dir() else path
        files = sorted(folder.glob("*.json"))
    else:
        files = [path] if path.exists() else []
    if not files:
        raise FileNotFoundError(2, "no live curve file (the collector writes "
                                   f"SEGMENTS/{FOLDER}/collector=NAME.json)", str(path))
    found = []
    for file in files:
        try:
            found += CurveFile.from_json(file.read_text()).instances
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{file}: not a live curve file ({type(error).__name__}: {error})") from None
    return tuple(sorted(found, key=lambda c: (c.engine, c.instance)))


def curve_of(curves: tuple[InstanceCurves, ...], instance: str | None,
             engine: str | None = None) -> InstanceCurves | None:
    """The curve of ``instance`` (``None``: the only one there is), of ``engine`` when given:
    where one instance has several (its engine's and a load probe's), the one with the most
    requests since start."""
    found = [c for c in curves if c.windows and (instance is None or c.instance == instance)
             and (engine is None or c.engine == engine)]
    if not found or (instance is None and len({c.instance for c in found}) > 1):
        return None
    return max(found, key=lambda c: c.window(ALL).requests if c.window(ALL) else 0)
