"""The headroom probe: how many host bytes a CPU KV tier may safely take.

Never free memory alone. Free memory ignores the page cache the kernel would reclaim (too
low) and ignores the limits of the cgroup the engine runs in (too high). The estimate is

    available = min(MemAvailable,                          # kernel's estimate, host-wide
                    cgroup limit - (usage - inactive file))  # container working set (kubelet's rule)
    safe      = available - margin - reserve

with ``margin = max(margin_fraction * bound, margin_min_bytes)`` where ``bound`` is the cgroup
limit or MemTotal, and ``reserve`` what the operator keeps for known needs (other processes'
growth, the file tier's page cache). Swap is never counted: a swapped KV block is slower than
recomputing it. On CUDA machines the tier is pinned memory, which the kernel can neither
reclaim nor swap, so the margin is what protects the rest of the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
_UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a page-rounded 2**63-1


@dataclass(frozen=True)
class HeadroomConfig:
    margin_fraction: float = 0.10
    margin_min_bytes: int = GIB
    reserve_bytes: int = 0
    root: str = "/"  # where /proc and /sys are (tests use a fake tree)

    def __post_init__(self) -> None:
        if not 0 <= self.margin_fraction < 1:
            raise ValueError(f"margin_fraction must be in [0, 1), got {self.margin_fraction!r}")
        for name in ("margin_min_bytes", "reserve_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class CgroupMemory:
    version: int
    path: str
    limit_bytes: int | None
    usage_bytes: int
    inactive_file_bytes: int

    @property
    def available_bytes(self) -> int | None:
        if self.limit_bytes is None:
            return None
        working_set = max(self.usage_bytes - self.inactive_file_bytes, 0)
        return max(self.limit_bytes - working_set, 0)


@dataclass(frozen=True)
class Headroom:
    mem_total_bytes: int
    mem_free_bytes: int
    mem_available_bytes: int
    page_cache_bytes: int
    swap_free_bytes: int
    cgroup: CgroupMemory | None
    available_bytes: int
    limited_by: str  # "host" | "cgroup"
    margin_bytes: int
    reserve_bytes: int
    safe_bytes: int

    def blocks(self, block_bytes: int) -> int:
        """How many KV blocks of ``block_bytes`` fit in the safe headroom."""
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be > 0, got {block_bytes}")
        return self.safe_bytes // block_bytes

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "cgroup"}
        out["cgroup"] = None if self.cgroup is None else {
            **self.cgroup.__dict__, "available_bytes": self.cgroup.available_bytes}
        return {"probe": "headroom", **out}


def meminfo(root: Path) -> dict[str, int]:
    """``/proc/meminfo`` in bytes."""
    values = {}
    for line in (root / "proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return values


def measure_headroom(config: HeadroomConfig = HeadroomConfig()) -> Headroom:
    root = Path(config.root)
    info = meminfo(root)
    for key in ("MemTotal", "MemFree", "MemAvailable"):
        if key not in info:
            raise ValueError(f"{root / 'proc/meminfo'} has no {key} (kernel older than 3.14?)")
    group = cgroup_memory(root)
    host = info["MemAvailable"]
    limited = group is not None and group.available_bytes is not None and group.available_bytes < host
    available = group.available_bytes if limited else host
    bound = group.limit_bytes if group is not None and group.limit_bytes is not None else info["MemTotal"]
    bound = min(bound, info["MemTotal"])
    margin = max(int(config.margin_fraction * bound), config.margin_min_bytes)
    safe = max(available - margin - config.reserve_bytes, 0)
    return Headroom(info["MemTotal"], info["MemFree"], host,
                    info.get("Cached", 0) + info.get("Buffers", 0), info.get("SwapFree", 0), group,
                    available, "cgroup" if limited else "host", margin, config.reserve_bytes, safe)


def cgroup_memory(root: Path) -> CgroupMemory | None:
    """This process's memory cgroup (v2 unified, or v1 ``memory`` controller); ``None`` if absent."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except FileNotFoundError:
        return None
    entries = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            entries[name] = path
    v2_mount = root / "sys/fs/cgroup"
    if "memory" in entries and (v2_mount / "memory").is_dir():
        return _v1(v2_mount / "memory", entries["memory"])
    if "" in entries and (v2_mount / "cgroup.controllers").exists():
        return _v2(v2_mount, entries[""])
    return None


def _existing(mount: Path, path: str, probe_file: str) -> Path:
    """The cgroup's folder as seen from this mount namespace: the deepest one that exists."""
    candidate = mount / path.lstrip("/")
    while candidate != mount and not (candidate / probe_file).exists():
        candidate = candidate.parent
    return candidate


def _stat(folder: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in (folder / "memory.stat").read_text().splitlines())}
    except FileNotFoundError:
        return {}


def _v1(mount: Path, path: str) -> CgroupMemory:
    folder = _existing(mount, path, "memory.limit_in_bytes")
    stat = _stat(folder)
    limit = stat.get("hierarchical_memory_limit") or int((folder / "memory.limit_in_bytes").read_text())
    usage = int((folder / "memory.usage_in_bytes").read_text())
    inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    return CgroupMemory(1, str(folder), None if limit >= _UNLIMITED else limit, usage, inactive)


def _v2(mount: Path, path: str) -> CgroupMemory:
    folder = _existing(mount, path, "memory.current")
    limits = []
    walk = folder
    while True:  # the effective limit is the smallest on the way to the root
        text = (walk / "memory.max").read_text().strip() if (walk / "memory.max").exists() else "max"
        if text != "max":
            limits.append(int(text))
        if walk == mount:
            break
        walk = walk.parent
    current = folder / "memory.current"
    usage = int(current.read_text()) if current.exists() else 0
    return CgroupMemory(2, str(folder), min(limits) if limits else None, usage,
                        _stat(folder).get("inactive_file", 0))
