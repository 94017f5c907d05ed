"""Dynamo KVBM writer: an environment file (``KEY=value`` lines, e.g. for ``env_file`` or
``set -a; . FILE``).

Mapping (NVIDIA Dynamo, ``lib/runtime/src/config/environment_names.rs`` at ``628d4ec`` and the KVBM guide): ``cpu_tier_bytes`` -> ``DYN_KVBM_CPU_CACHE_GB``
(GiB rounded down, see :func:`kvtier.policy.writers.settings.gib`); a cold tier ->
``DYN_KVBM_DISK_CACHE_GB`` and ``DYN_KVBM_DISK_CACHE_DIR`` (KVBM needs a CPU tier for a
disk tier); ``offload_min_priority`` -> ``DYN_KVBM_HOST_OFFLOAD_PREFIX_MIN_PRIORITY``
(0-100; offload stops at the first block below it); ``kv_events`` -> ``DYN_KVBM_METRICS``
is left alone (metrics are a separate opt-in) and noted.
"""

from __future__ import annotations

from kvtier.policy.writers.choices import Choices
from kvtier.policy.writers.settings import EngineSettings, Rendered, gib
from kvtier.policy.writers.textedit import env_get, env_set

ENGINE = "dynamo"
FORMATS = (".env",)
DEFAULT_FILE = "dynamo.env"  # the file kvtier recommend writes
FILE_HELP = ".env (KVBM variables)"
OFF = EngineSettings(cpu_tier_bytes=0)  # what turns offloading off


def recommended(choices: Choices) -> tuple[EngineSettings, tuple[str, ...]]:
    """KVBM takes the CPU tier and the learned offload threshold as they are; the sighting
    filter is its v2 policies' ``presence_lfu`` on the GPU -> host offload, which lives in the
    TOML ``KVBM_CONFIG_PATH`` names, not in this env file: a note gives its lines."""
    notes = () if choices.admission != "sightings" else (
        f"the CPU tier's admission is a sighting filter (admit on sighting "
        f"{choices.min_sightings}); KVBM v2 takes it in the TOML file KVBM_CONFIG_PATH names: "
        f'[offload.g1_to_g2] policies = ["presence", "presence_lfu"] and '
        f"[offload.g1_to_g2.presence_lfu] min_lfu_count = {choices.min_sightings}",)
    return EngineSettings(cpu_tier_bytes=choices.cpu_tier_bytes,
                          offload_min_priority=choices.min_priority,
                          kv_events=True), notes + choices.gpu_filter_note("Dynamo KVBM")


def validate(settings: EngineSettings, existing: str = "") -> None:
    if settings.eviction_policy is not None:
        raise ValueError("Dynamo KVBM's eviction is set by its v2 policy files, not by kvtier; "
                         "leave eviction_policy unset")
    if settings.gpu_sightings:
        raise ValueError("Dynamo KVBM has no GPU prefix-cache sighting filter (gpu_sightings): "
                         "kvtier's vLLM connector applies it to vLLM only")
    if settings.store_threshold:
        raise ValueError("Dynamo KVBM has no store_threshold (its disk filter is "
                         "presence_lfu in the v2 TOML)")
    cpu_off = settings.cpu_tier_bytes == 0 or (
        settings.cpu_tier_bytes is None and env_get(existing, "DYN_KVBM_CPU_CACHE_GB") in (None, "0"))
    if settings.cold_tier_bytes and cpu_off:
        raise ValueError("Dynamo KVBM needs a CPU tier for a disk tier; set cpu_tier_bytes > 0")


def updates(settings: EngineSettings, existing: str = "") -> dict:
    validate(settings, existing)
    out = {}
    if settings.cpu_tier_bytes is not None:
        out["DYN_KVBM_CPU_CACHE_GB"] = gib(settings.cpu_tier_bytes)
    if settings.cold_tier_bytes is not None:
        out["DYN_KVBM_DISK_CACHE_GB"] = gib(settings.cold_tier_bytes)
    if settings.cold_tier_path is not None and settings.cold_tier_bytes != 0:
        out["DYN_KVBM_DISK_CACHE_DIR"] = settings.cold_tier_path
    if settings.offload_min_priority is not None:
        out["DYN_KVBM_HOST_OFFLOAD_PREFIX_MIN_PRIORITY"] = settings.offload_min_priority
    return out


def render(settings: EngineSettings, existing: str | None, suffix: str, *,
           force: bool = False) -> Rendered:
    if suffix not in FORMATS:
        raise ValueError(f"Dynamo KVBM settings are an env file ({', '.join(FORMATS)}), got {suffix!r}")
    text = existing or ""
    notes = []
    if settings.kv_events:
        notes.append("KVBM metrics need DYN_KVBM_METRICS=true (port DYN_KVBM_METRICS_PORT, 6880)")
    ignored = [f for f in ("save_priority_limit", "write_policy", "block_size_tokens")
               if getattr(settings, f) is not None]
    if ignored:
        notes.append(f"not applicable to Dynamo KVBM, ignored: {', '.join(ignored)}")
    return Rendered(env_set(text, updates(settings, text)), tuple(notes))
