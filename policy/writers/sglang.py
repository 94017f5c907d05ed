"""SGLang HiCache writer: a launch-arguments file (one ``--flag value`` per line, as
``python -m sglang.launch_server $(grep -v '^#' FILE)`` reads it).

Mapping (SGLang, ``python/sglang/srt/arg_groups/fields/memory.py`` at ``09eaaf1``): ``cpu_tier_bytes`` ->
``--enable-hierarchical-cache`` and ``--hicache-size`` (integer GB per rank, rounded down;
it overrides ``--hicache-ratio``, which is removed); 0 turns HiCache off; a cold tier ->
``--hicache-storage-backend file`` (directory through ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR``);
``write_policy`` -> ``--hicache-write-policy``; ``eviction_policy`` -> ``--radix-eviction-policy``
(lru, lfu, slru, priority); ``block_size_tokens`` -> ``--page-size``.
"""

from __future__ import annotations

from kvtier.policy.writers.choices import Choices
from kvtier.policy.writers.settings import EngineSettings, Rendered
from kvtier.policy.writers.textedit import args_set

ENGINE = "sglang"
FORMATS = (".args", ".txt", ".conf")
DEFAULT_FILE = "sglang.args"  # the file kvtier recommend writes
FILE_HELP = ".args (one launch flag per line)"
EVICTION_POLICIES = ("lru", "lfu", "slru", "priority")
OFF = EngineSettings(cpu_tier_bytes=0)  # what turns offloading off


def recommended(choices: Choices) -> tuple[EngineSettings, tuple[str, ...]]:
    """The CPU size under LRU; SGLang's nearest knob to an admission gate is selective
    write-through, taken when the gate helps."""
    return EngineSettings(cpu_tier_bytes=choices.cpu_tier_bytes, eviction_policy="lru",
                          write_policy="write_through_selective" if choices.admission_helps
                          else "write_through"), choices.gpu_filter_note("SGLang")


def validate(settings: EngineSettings) -> None:
    if settings.eviction_policy not in (None, *EVICTION_POLICIES):
        raise ValueError(f"SGLang --radix-eviction-policy {settings.eviction_policy!r} is not "
                         f"one of {', '.join(EVICTION_POLICIES)}")
    if settings.gpu_sightings:
        raise ValueError("SGLang has no GPU prefix-cache sighting filter (gpu_sightings): "
                         "kvtier's vLLM connector applies it to vLLM only")
    if settings.store_threshold:
        raise ValueError("SGLang has no store_threshold; use write_policy "
                         "write_through_selective")
    per_rank = (settings.cpu_tier_bytes or 0) // settings.ranks
    if settings.cpu_tier_bytes and per_rank < (1 << 30):
        raise ValueError(f"--hicache-size is whole GB per rank; {per_rank} bytes per rank "
                         "rounds to 0, which SGLang reads as 'use --hicache-ratio'")


def updates(settings: EngineSettings) -> dict:
    validate(settings)
    out = {}
    if settings.cpu_tier_bytes is not None:
        enabled = settings.cpu_tier_bytes > 0
        out["--enable-hierarchical-cache"] = enabled
        out["--hicache-ratio"] = False
        out["--hicache-size"] = settings.cpu_tier_bytes // settings.ranks // (1 << 30) \
            if enabled else False
    if settings.cold_tier_bytes == 0:
        out["--hicache-storage-backend"] = False
    elif settings.cold_tier_path is not None:
        out["--hicache-storage-backend"] = "file"
    if settings.write_policy is not None:
        out["--hicache-write-policy"] = settings.write_policy
    if settings.eviction_policy is not None:
        out["--radix-eviction-policy"] = settings.eviction_policy
    if settings.block_size_tokens is not None:
        out["--page-size"] = settings.block_size_tokens
    return out


def render(settings: EngineSettings, existing: str | None, suffix: str, *,
           force: bool = False) -> Rendered:
    if suffix not in FORMATS:
        raise ValueError(f"SGLang argument files are {', '.join(FORMATS)}, got {suffix!r}")
    notes = []
    if settings.cold_tier_path and settings.cold_tier_bytes != 0:
        notes.append(f"set SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR={settings.cold_tier_path} "
                     "in the server's environment; the file backend has no size limit flag")
    if settings.kv_events:
        notes.append("KV events: add --kv-events-config with a zmq publisher; SGLang's "
                     "events carry no tier (medium), so only GPU residency is visible")
    ignored = [f for f in ("offload_min_priority", "save_priority_limit")
               if getattr(settings, f) is not None]
    if ignored:
        notes.append(f"not applicable to SGLang, ignored: {', '.join(ignored)}")
    return Rendered(args_set(existing or "", updates(settings)), tuple(notes))
