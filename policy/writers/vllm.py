"""vLLM (0.33.0) writer: ``--kv-transfer-config`` for the native ``OffloadingConnector``.

Files it edits:

* ``*.json``: the ``--kv-transfer-config`` object itself
  (``vllm serve M --kv-transfer-config "$(cat file.json)"``).
* ``*.yaml`` / ``*.yml``: a ``vllm serve --config`` file; kvtier sets ``kv-transfer-config``
  (and ``kv-events-config``) as JSON strings, or key by key where the file writes them as
  YAML mappings (vLLM reads both), keeping every other key and comment. vLLM reads a key with
  dashes or underscores as one flag, so the key is found either way and keeps its spelling.

Mapping (vLLM 0.33.0, ``vllm/config/cache.py``, ``vllm/engine/arg_utils.py`` and the ``kv_connector_extra_config`` keys the offloading connector reads): ``cpu_tier_bytes`` -> ``cpu_bytes_to_use``
(total over ranks); a cold tier -> ``spec_name: TieringOffloadingSpec`` with one ``fs``
secondary tier at ``cold_tier_path`` (``cold_tier_bytes: 0`` removes it: the rollback of the
newest tier); ``eviction_policy`` lru|arc; ``store_threshold`` (0, or >= 2 and only without
a secondary tier: ``TieringOffloadingSpec`` rejects it); ``block_size_tokens`` -> the offload
chunk ``block_size`` (a multiple of the GPU block size). ``kv_events`` -> a ZMQ publisher
that connects to a collector bound on 127.0.0.1:5557, with its replay socket on :5558.
"""

from __future__ import annotations

import json

from kvtier.policy.writers.settings import EngineSettings, Rendered, gib
from kvtier.policy.writers.yamledit import ConfigFileError, yaml_get, yaml_set

ENGINE = "vllm"
FORMATS = (".json", ".yaml", ".yml")
EVICTION_POLICIES = ("lru", "arc")
APPLIES = ("cpu_tier_bytes", "cold_tier_bytes", "cold_tier_path", "eviction_policy",
           "store_threshold", "block_size_tokens", "kv_events")
KV_EVENTS_CONFIG = {"enable_kv_cache_events": True, "publisher": "zmq",
                    "endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558"}


def validate(settings: EngineSettings) -> None:
    """Raise ``ValueError`` for values vLLM 0.33.0 cannot take."""
    if settings.eviction_policy not in (None, *EVICTION_POLICIES):
        raise ValueError(f"vLLM eviction_policy {settings.eviction_policy!r} is not one of "
                         f"{', '.join(EVICTION_POLICIES)}")
    if settings.cpu_tier_bytes == 0:
        raise ValueError("vLLM has no zero-size CPU tier: to turn offloading off, drop "
                         "--kv-transfer-config (and --kv-offloading-size)")
    if (settings.cold_tier_path and settings.cold_tier_bytes != 0
            and settings.store_threshold and settings.store_threshold >= 2):
        raise ValueError(f"store_threshold={settings.store_threshold} with a secondary tier: "
                         "vLLM's TieringOffloadingSpec rejects store_threshold >= 2; use 0")


def transfer_config(settings: EngineSettings, existing: dict | None = None) -> dict:
    """The ``--kv-transfer-config`` object: ``existing`` with kvtier's keys set."""
    validate(settings)
    config = dict(existing or {})
    config["kv_connector"] = "OffloadingConnector"
    config["kv_role"] = "kv_both"
    extra = dict(config.get("kv_connector_extra_config") or {})
    for key, value in (("cpu_bytes_to_use", settings.cpu_tier_bytes),
                       ("eviction_policy", settings.eviction_policy),
                       ("store_threshold", settings.store_threshold),
                       ("block_size", settings.block_size_tokens)):
        if value is not None:
            extra[key] = value
    if "cpu_bytes_to_use" not in extra:
        raise ValueError("vLLM's OffloadingConnector needs cpu_tier_bytes (cpu_bytes_to_use)")
    _apply_cold_tier(settings, extra)
    if extra.get("spec_name") == "TieringOffloadingSpec" and extra.get("store_threshold", 0) >= 2:
        raise ValueError("the file's secondary tier and store_threshold >= 2 conflict: "
                         "vLLM's TieringOffloadingSpec rejects it; set store_threshold 0")
    config["kv_connector_extra_config"] = extra
    return config


def _apply_cold_tier(settings: EngineSettings, extra: dict) -> None:
    if settings.cold_tier_bytes == 0:
        extra.pop("secondary_tiers", None)
        if extra.get("spec_name") == "TieringOffloadingSpec":
            extra["spec_name"] = "CPUOffloadingSpec"
    elif settings.cold_tier_path is not None:
        extra["spec_name"] = "TieringOffloadingSpec"
        tiers = [t for t in extra.get("secondary_tiers", []) if t.get("type") != "fs"]
        extra["secondary_tiers"] = tiers + [{"type": "fs", "root_dir": settings.cold_tier_path,
                                             "enable_kv_events": True}]


def short_form(settings: EngineSettings) -> list[str] | None:
    """``--kv-offloading-size GiB`` when the CPU size is all that is set, else ``None``."""
    others = [f for f in APPLIES if f not in ("cpu_tier_bytes",) and getattr(settings, f) is not None]
    if settings.cpu_tier_bytes is None or others:
        return None
    validate(settings)
    return ["--kv-offloading-size", repr(gib(settings.cpu_tier_bytes))]


def render(settings: EngineSettings, existing: str | None, suffix: str) -> Rendered:
    """The new file text for a ``suffix`` file whose current text is ``existing``."""
    if suffix == ".json":
        current = _json_object(existing, "the file") if existing and existing.strip() else None
        text = json.dumps(transfer_config(settings, current), indent=2) + "\n"
        notes = _notes(settings)
        if settings.kv_events:
            notes += (f"KV events are a separate flag: --kv-events-config "
                      f"'{json.dumps(KV_EVENTS_CONFIG)}'",)
        return Rendered(text, notes)
    if suffix in (".yaml", ".yml"):
        return _render_yaml(settings, existing or "")
    raise ValueError(f"vLLM config files are {', '.join(FORMATS)}, got {suffix!r}")


def _render_yaml(settings: EngineSettings, existing: str) -> Rendered:
    updates = {}
    for key, value in (("kv-transfer-config", None), ("kv-events-config", None)):
        if key == "kv-events-config" and settings.kv_events is None:
            continue
        raw = yaml_get(existing, (key,), spellings=True)
        current = _json_object(raw, key) if isinstance(raw, str) and raw.strip() else raw
        if current is not None and not isinstance(current, dict):
            raise ConfigFileError(f"{key} must be a JSON object or a mapping, got {raw!r}")
        if key == "kv-transfer-config":
            value = transfer_config(settings, current)
        else:
            value = dict(current or {})
            value.update(KV_EVENTS_CONFIG if settings.kv_events else {"enable_kv_cache_events": False})
        updates[(key,)] = value if isinstance(raw, dict) else json.dumps(value)  # the file's style
    return Rendered(yaml_set(existing, updates, spellings=True), _notes(settings))


def _json_object(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ConfigFileError(f"{what} is not valid JSON ({error}); fix it first") from None
    if not isinstance(value, dict):
        raise ConfigFileError(f"{what} must hold a JSON object (the --kv-transfer-config "
                              f"object), got {type(value).__name__}")
    return value


def _notes(settings: EngineSettings) -> tuple[str, ...]:
    notes = []
    if settings.cold_tier_bytes:
        notes.append(f"vLLM 0.33.0's fs tier has no capacity limit (vllm#54779): "
                     f"cold_tier_bytes={settings.cold_tier_bytes} is not enforced; watch "
                     f"{settings.cold_tier_path}")
    ignored = [f for f in ("offload_min_priority", "save_priority_limit", "write_policy")
               if getattr(settings, f) is not None]
    if ignored:
        notes.append(f"not applicable to vLLM, ignored: {', '.join(ignored)}")
    return tuple(notes)
