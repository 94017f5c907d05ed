"""TensorRT-LLM writer: the ``trtllm-serve --config`` YAML (``kv_cache_config`` section).

Mapping (TensorRT-LLM, ``tensorrt_llm/llmapi/llm_args.py`` ``KvCacheConfig`` at ``0004396``, and the ``trtllm-serve`` YAML): ``cpu_tier_bytes`` -> per-rank
``host_cache_size`` (bytes; each rank's cache manager owns its host pool);
``offload_min_priority`` -> ``secondary_offload_min_priority`` placed so that it means the
same under the documented rule (offload if priority > value, default 35) and the coded one
(>= value, default 30; ``evictionPolicy.cpp``); ``kv_events`` -> ``event_buffer_max_size``;
``block_size_tokens`` -> ``tokens_per_block``; a cold tier -> the V2 manager's
``disk_cache_size``/``disk_cache_path``. It always sets ``enable_iter_perf_stats: true``
(the ``trtllm_kv_cache_*`` gauges need it) and ``enable_block_reuse: true`` (offload and
events need reuse). A ``.json`` file is the gateway's per-request-class
``KvCacheRetentionConfig`` (from ``retention_classes``: the whole prompt at one priority, and
``retention_ranges``: a priority per token range plus decode), merged by class name.
"""

from __future__ import annotations

import json
from typing import Mapping

from kvtier.policy.writers.choices import Choices
from kvtier.policy.writers.settings import EngineSettings, Rendered
from kvtier.policy.writers.trtllm_retention import DEFAULT_RETENTION_PRIORITY
from kvtier.policy.writers.inputs import NotReadable, load_json
from kvtier.policy.writers.yamledit import ConfigFileError, yaml_set

ENGINE = "trtllm"
FORMATS = (".yaml", ".yml", ".json")  # .json: the gateway's per-class retention configs
DEFAULT_FILE = "trtllm.yaml"  # the file kvtier recommend writes
FILE_HELP = ".yaml (trtllm-serve --config) or .json (per-class retention for the gateway)"
EVENT_BUFFER_SIZE = 16384
SECTION = "kv_cache_config"
OFF = EngineSettings(cpu_tier_bytes=0)  # what turns offloading off


def recommended(choices: Choices) -> tuple[EngineSettings, tuple[str, ...]]:
    """The learned threshold as ``secondary_offload_min_priority``: over the priorities the
    per-class token ranges give when there are any, else over the per-class priorities."""
    ranges = tuple(choices.ranges)
    if ranges and choices.range_min_priority is not None:
        settings = EngineSettings(cpu_tier_bytes=choices.cpu_tier_bytes,
                                  offload_min_priority=choices.range_min_priority,
                                  retention_ranges=ranges, kv_events=True)
    else:
        settings = EngineSettings(cpu_tier_bytes=choices.cpu_tier_bytes,
                                  offload_min_priority=choices.min_priority,
                                  retention_priorities=tuple(choices.classes), kv_events=True)
    sightings = () if choices.admission != "sightings" else (
        f"the CPU tier's admission is a sighting filter (admit on sighting "
        f"{choices.min_sightings}): TensorRT-LLM gates offload by retention priority only, so "
        "it cannot take it; its threshold below is the learned gate's",)
    return settings, sightings + choices.gpu_filter_note("TensorRT-LLM") + (
        "the gateway should send each request class's KvCacheRetentionConfig "
        f"(trtllm.retention.json): {_ranges_text(ranges)}; "
        f"offload_min_priority={choices.range_min_priority} is the best threshold over the "
        "priorities those ranges give (evidence: token_range_sweep); the expected change is "
        "measured for the per-block gate, which token ranges approximate",)


def _ranges_text(ranges) -> str:
    return "; ".join(
        f"{c.name}: " + ", ".join(f"tokens {r.token_start}-{r.token_end or 'end'} -> {r.priority}"
                                  for r in c.token_ranges) + f", decode -> {c.decode_priority}"
        for c in ranges) or "none"


def offload_threshold(min_priority: int, priorities: tuple[int, ...]) -> tuple[int, list, list]:
    """A ``secondary_offload_min_priority`` for "offload priorities >= ``min_priority``".

    Priorities in use are ``priorities`` plus TRT-LLM's default 35. The value ``t`` must
    satisfy ``max(kept) < t < min(offloaded)`` so that no priority in use equals ``t``:
    then ``p > t`` (documented) and ``p >= t`` (coded) select the same blocks; within that
    range the value nearest ``min_priority`` is taken, so a class added later is judged
    close to the intent. Returns
    ``(t, offloaded, kept)``; ``ValueError`` when two classes sit on adjacent integers
    around the cut, where no such value exists.
    """
    in_use = sorted(set(priorities) | {DEFAULT_RETENTION_PRIORITY})
    offloaded = [p for p in in_use if p >= min_priority]
    kept = [p for p in in_use if p < min_priority]
    low = kept[-1] if kept else -1
    high = offloaded[0] if offloaded else 101
    if high - low < 2:
        raise ValueError(f"offload_min_priority={min_priority}: priorities {low} and {high} are "
                         "adjacent, so no threshold means the same under TRT-LLM's documented "
                         "(>) and coded (>=) rules; move a retention class")
    return min(max(min_priority, low + 1), high - 1), offloaded, kept


def validate(settings: EngineSettings) -> None:
    if settings.eviction_policy not in (None, "lru", "priority"):
        raise ValueError(f"TensorRT-LLM evicts by priority then LRU; eviction_policy "
                         f"{settings.eviction_policy!r} is not one of lru, priority")
    if settings.gpu_sightings:
        raise ValueError("TensorRT-LLM has no GPU prefix-cache sighting filter (gpu_sightings): "
                         "kvtier's vLLM connector applies it to vLLM only")
    if settings.store_threshold:
        raise ValueError("TensorRT-LLM has no store_threshold; use offload_min_priority")
    if settings.offload_min_priority is not None:
        offload_threshold(settings.offload_min_priority, settings.priorities_in_use)


def updates(settings: EngineSettings) -> tuple[dict, list[str]]:
    """YAML path -> value, and the notes explaining them."""
    validate(settings)
    out = {("enable_iter_perf_stats",): True, (SECTION, "enable_block_reuse"): True}
    notes = []
    if settings.cpu_tier_bytes is not None:
        out[(SECTION, "host_cache_size")] = settings.cpu_tier_bytes // settings.ranks
        if settings.ranks > 1:
            notes.append(f"host_cache_size is per rank: {settings.cpu_tier_bytes} bytes "
                         f"over {settings.ranks} ranks")
    if settings.offload_min_priority is not None:
        t, offloaded, kept = offload_threshold(settings.offload_min_priority,
                                               settings.priorities_in_use)
        out[(SECTION, "secondary_offload_min_priority")] = t
        notes.append(f"secondary_offload_min_priority={t}: offloads priorities {offloaded}, "
                     f"keeps {kept or 'none'} GPU-only, the same under the documented rule "
                     f"(priority > {t}) and the coded rule (priority >= {t}); builds before "
                     "TensorRT-LLM PR #13768 ignore it on the PyTorch backend")
    if settings.kv_events is not None:
        out[(SECTION, "event_buffer_max_size")] = EVENT_BUFFER_SIZE if settings.kv_events else 0
    if settings.block_size_tokens is not None:
        out[(SECTION, "tokens_per_block")] = settings.block_size_tokens
    if settings.cold_tier_bytes is not None:
        out[(SECTION, "disk_cache_size")] = settings.cold_tier_bytes // settings.ranks
        if settings.cold_tier_path is not None:
            out[(SECTION, "disk_cache_path")] = settings.cold_tier_path
        notes.append("disk_cache_size/disk_cache_path need the V2 KV cache manager "
                     "(use_kv_cache_manager_v2), and the path must exist")
    return out, notes


def render(settings: EngineSettings, existing: str | None, suffix: str, *,
           force: bool = False) -> Rendered:
    if suffix not in FORMATS:
        raise ValueError(f"TensorRT-LLM config files are {', '.join(FORMATS)}, got {suffix!r}")
    if suffix == ".json":
        return _render_retention(settings, existing)
    values, notes = updates(settings)
    ignored = [f for f in ("save_priority_limit", "write_policy") if getattr(settings, f) is not None]
    if ignored:
        notes.append(f"not applicable to TensorRT-LLM, ignored: {', '.join(ignored)}")
    if settings.retention_classes or settings.retention_ranges:
        notes.append("per-request retention (retention_classes, retention_ranges) is not a "
                     "server setting: write it to a .json file for the gateway")
    return Rendered(yaml_set(existing or "", values), tuple(notes))


def _render_retention(settings: EngineSettings, existing: str | None) -> Rendered:
    """The gateway file: existing classes kept, the settings' classes set."""
    validate(settings)
    if not settings.retention_classes and not settings.retention_ranges:
        raise ValueError("a TensorRT-LLM .json file holds per-class retention configs; "
                         "the settings have no retention_classes or retention_ranges")
    try:
        current = load_json(existing, "the file") if existing and existing.strip() else {}
    except NotReadable as error:  # nested too deep
        raise ConfigFileError(str(error)) from None
    except ValueError as error:
        raise ConfigFileError(f"the file is not valid JSON ({error}); fix it first") from None
    if not isinstance(current, dict):
        raise ConfigFileError("the retention file must hold a JSON object of request classes")
    if settings.retention_classes:
        current.update(json.loads(retention_json(dict(settings.retention_classes))))
    current.update({c.name: c.to_dict() for c in settings.retention_ranges})
    return Rendered(json.dumps(current, indent=2) + "\n", (
        "send each request class's entry as kv_cache_retention_config (LLM API / Dynamo's "
        "TensorRT-LLM handler); trtllm-serve's OpenAI API has no per-request field for it",))


def retention_json(classes: Mapping[str, int], duration_ms: Mapping[str, int] | None = None) -> str:
    """Per request class, the ``KvCacheRetentionConfig`` a gateway sends (LLM API keywords):
    the whole prompt at the class's priority, decode at the default."""
    out = {}
    for name, priority in classes.items():
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 100:
            raise ValueError(f"retention priority for {name!r} must be in 0..100, got {priority!r}")
        out[name] = {
            "token_range_retention_configs": [{
                "token_start": 0, "token_end": None, "priority": priority,
                "duration_ms": (duration_ms or {}).get(name)}],
            "decode_retention_priority": DEFAULT_RETENTION_PRIORITY,
            "decode_duration_ms": None}
    return json.dumps(out, indent=2) + "\n"
