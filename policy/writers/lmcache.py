"""LMCache writer: the YAML file ``LMCACHE_CONFIG_FILE`` points to (flat keys).

Mapping (LMCache, ``lmcache/v1/config.py`` ``_CONFIG_DEFINITIONS`` at ``3ecd72f``): ``cpu_tier_bytes`` -> ``local_cpu`` and
``max_local_cpu_size`` (GB, per worker, written as GiB rounded down so either reading of
"GB" stays within the bytes asked for); a cold tier -> ``local_disk: "file://PATH/"`` and
``max_local_disk_size``; ``eviction_policy`` -> ``cache_policy`` (LRU, LFU, FIFO);
``save_priority_limit`` -> ``priority_limit``; ``block_size_tokens`` -> ``chunk_size``;
``kv_events`` -> ``enable_kv_events``.
"""

from __future__ import annotations

from kvtier.policy.writers.choices import GATE, Choices
from kvtier.policy.writers.settings import EngineSettings, Rendered, gib
from kvtier.policy.writers.yamledit import yaml_set

ENGINE = "lmcache"
FORMATS = (".yaml", ".yml")
DEFAULT_FILE = "lmcache.yaml"  # the file kvtier recommend writes
FILE_HELP = ".yaml (LMCACHE_CONFIG_FILE)"
CACHE_POLICIES = {"lru": "LRU", "lfu": "LFU", "fifo": "FIFO"}
OFF = EngineSettings(cpu_tier_bytes=0)  # what turns offloading off


def recommended(choices: Choices) -> tuple[EngineSettings, tuple[str, ...]]:
    """The CPU size under LRU; the gate is per block, LMCache's ``priority_limit`` per request."""
    return (EngineSettings(cpu_tier_bytes=choices.cpu_tier_bytes, eviction_policy="lru"),
            (f"LMCache's priority_limit is per request, not per block: {GATE} is not applied",
             *choices.gpu_filter_note("LMCache")))


def validate(settings: EngineSettings) -> None:
    if settings.eviction_policy not in (None, *CACHE_POLICIES):
        raise ValueError(f"LMCache cache_policy {settings.eviction_policy!r} is not one of "
                         f"{', '.join(CACHE_POLICIES)}")
    if settings.gpu_sightings:
        raise ValueError("LMCache has no GPU prefix-cache sighting filter (gpu_sightings): "
                         "kvtier's vLLM connector applies it to vLLM only")
    if settings.store_threshold:
        raise ValueError("LMCache has no store_threshold; use save_priority_limit")


def updates(settings: EngineSettings) -> dict:
    validate(settings)
    out = {}
    if settings.cpu_tier_bytes is not None:
        out[("local_cpu",)] = settings.cpu_tier_bytes > 0
        out[("max_local_cpu_size",)] = gib(settings.cpu_tier_bytes // settings.ranks)
    if settings.cold_tier_bytes == 0:
        out[("max_local_disk_size",)] = 0.0
    elif settings.cold_tier_path is not None:
        out[("local_disk",)] = "file://" + settings.cold_tier_path.rstrip("/") + "/"
        if settings.cold_tier_bytes is not None:
            out[("max_local_disk_size",)] = gib(settings.cold_tier_bytes // settings.ranks)
    if settings.eviction_policy is not None:
        out[("cache_policy",)] = CACHE_POLICIES[settings.eviction_policy]
    if settings.save_priority_limit is not None:
        out[("priority_limit",)] = settings.save_priority_limit
    if settings.block_size_tokens is not None:
        out[("chunk_size",)] = settings.block_size_tokens
    if settings.kv_events is not None:
        out[("enable_kv_events",)] = settings.kv_events
    return out


def render(settings: EngineSettings, existing: str | None, suffix: str, *,
           force: bool = False) -> Rendered:
    if suffix not in FORMATS:
        raise ValueError(f"LMCache config files are {', '.join(FORMATS)}, got {suffix!r}")
    notes = []
    if settings.ranks > 1 and settings.cpu_tier_bytes:
        notes.append(f"max_local_cpu_size is per worker: {settings.cpu_tier_bytes} bytes "
                     f"over {settings.ranks} workers")
    ignored = [f for f in ("offload_min_priority", "write_policy") if getattr(settings, f) is not None]
    if ignored:
        notes.append(f"not applicable to LMCache, ignored: {', '.join(ignored)}")
    return Rendered(yaml_set(existing or "", updates(settings)), tuple(notes))
