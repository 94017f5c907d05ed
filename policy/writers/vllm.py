"""vLLM (0.33.0) writer: ``--kv-transfer-config`` for vLLM's ``OffloadingConnector``, or for
kvtier's recording connector where the file loads it.

Files it edits:

* ``*.json``: the ``--kv-transfer-config`` object itself
  (``vllm serve M --kv-transfer-config "$(cat file.json)"``).
* ``*.yaml`` / ``*.yml``: a ``vllm serve --config`` file; kvtier sets ``kv-transfer-config``
  (and ``kv-events-config``) as JSON strings, or key by key where the file writes them as
  YAML mappings (vLLM reads both), keeping every other key and comment. vLLM reads a key with
  dashes or underscores as one flag, so the key is found either way and keeps its spelling.

Mapping (vLLM 0.33.0, ``vllm/config/cache.py``, ``vllm/engine/arg_utils.py`` and the
``kv_connector_extra_config`` keys the offloading connector reads): ``cpu_tier_bytes`` ->
``cpu_bytes_to_use`` (total over ranks); a cold tier -> the tiering spec with one ``fs``
secondary tier at ``cold_tier_path`` (``cold_tier_bytes: 0`` removes it: the rollback of the
newest tier); ``eviction_policy`` lru|arc; ``store_threshold`` (0, or >= 2 and only without
a secondary tier: the tiering spec rejects it); ``block_size_tokens`` -> the offload chunk
``block_size`` (a multiple of the GPU block size); ``kv_events`` -> ``enable_kv_cache_events``;
``gpu_sightings`` -> ``kvtier_gpu_sightings``, which only kvtier's connector reads (it keeps a
new block out of vLLM's GPU prefix cache until its N-th request): a new file then loads
kvtier's connector, a file that loads vLLM's own is refused with the change to make, and 0
removes the key.

What a push keeps: the connector the file loads, when it is vLLM's ``OffloadingConnector``
or kvtier's recording ``KvtierOffloadingConnector`` (with its module path), the spec family
(vLLM's, or kvtier's recording specs from ``kvtier.probes.vllm.spec``: a tier change moves
between the CPU and the tiering spec of the same family), every ``kvtier_*`` key and every
KV-events setting but the on/off switch; it never writes an endpoint, and a file with no
KV-events settings gets none (a note names the line to add). Another connector
(LMCache's, say) is replaced only with ``force``. ``cpu_tier_bytes: 0`` keeps the connector
and spec loaded with ``cpu_bytes_to_use: 1``, the smallest value vLLM takes: zero CPU
chunks, so nothing is offloaded, and kvtier's plug-ins go on recording every request.
A serve YAML's ``kv-offloading-size`` and ``kv-offloading-backend``, with which vLLM would
override the transfer config's connector and size, are removed and the CPU tier is written
into the transfer config (:mod:`kvtier.policy.writers.vllm_offloading`). Every config it
writes passes :func:`kvtier.policy.writers.vllm_shape.check`, and vLLM must run it as
written (:func:`kvtier.policy.writers.vllm_shape.resolve`): a note says which connector and
size it will run.
"""

from __future__ import annotations

import json

from kvtier.policy.writers.choices import GATE, Choices
from kvtier.policy.writers.settings import EngineSettings, Rendered
import kvtier.policy.writers.vllm_offloading as offloading
from kvtier.policy.writers.vllm_shape import (KVTIER_CONNECTORS, KVTIER_SPECS, ShapeError, check,
                                              resolve)
from kvtier.policy.writers.inputs import NotReadable, load_json
from kvtier.policy.writers.yamledit import ConfigFileError, YamlDoc

ENGINE = "vllm"
FORMATS = (".json", ".yaml", ".yml")
DEFAULT_FILE = "vllm.json"  # the file kvtier recommend writes
FILE_HELP = ".json (the --kv-transfer-config object) or .yaml (vllm serve --config)"
EVICTION_POLICIES = ("lru", "arc")
APPLIES = ("cpu_tier_bytes", "cold_tier_bytes", "cold_tier_path", "eviction_policy",
           "store_threshold", "gpu_sightings", "block_size_tokens", "kv_events")
NATIVE_CONNECTOR = "OffloadingConnector"
KVTIER_CONNECTOR_MODULE = "kvtier.probes.vllm.connector"
KVTIER_CONNECTOR = KVTIER_CONNECTORS[KVTIER_CONNECTOR_MODULE][0]
GPU_SIGHTINGS_KEY = "kvtier_gpu_sightings"  # what kvtier's connector reads
ZERO_CPU_BYTES = 1  # vLLM refuses 0 ("must be specified"); 1 byte holds zero chunks
# Offloading off: the minimal CPU tier (ZERO_CPU_BYTES holds no chunk), so kvtier's connector
# stays loaded and the engine keeps recording, and a do-not-offload recommendation pushes
OFF = EngineSettings(cpu_tier_bytes=0, kv_events=True)
# spec_module_path -> (the CPU spec, the CPU + secondary-tier spec) of one family
SPEC_FAMILIES = {None: ("CPUOffloadingSpec", "TieringOffloadingSpec"), **KVTIER_SPECS}
# what a user adds for events kvtier can collect: vLLM connects to a concrete host (it binds
# only a "*" endpoint), and the endpoint is the user's to name
EVENTS_LINE = ("""kv-events-config: '{"enable_kv_cache_events": true, "publisher": "zmq", """
               """"endpoint": "<the endpoint kvtier collect --vllm-events binds>"}'""")


def recommended(choices: Choices) -> tuple[EngineSettings, tuple[str, ...]]:
    """The best ``(eviction_policy, store_threshold)`` replayed under vLLM's semantics, its CPU
    tier sized for the copy it keeps of the GPU's blocks, and the file tier when it was
    chosen and has a directory (its ``store_threshold`` is then 0)."""
    policy, store_threshold = choices.vllm_cpu
    cpu_bytes = (choices.cpu_tier_bytes if choices.vllm_cpu_bytes is None
                 else choices.vllm_cpu_bytes)
    admission = (f"admit on sighting {choices.min_sightings}" if choices.admission == "sightings"
                 else "admit every block" if choices.admission == "all" else GATE)
    notes = [f"the CPU tier's admission: {admission}; vLLM counts sightings as store_threshold "
             f"and cannot express {GATE}; eviction_policy={policy}, "
             f"store_threshold={store_threshold} is the best of lru/arc x that admission's "
             "store_threshold and 0, replayed under vLLM's semantics"]
    gpu = choices.vllm_gpu_sightings
    if gpu:
        notes.append(f"the GPU prefix cache keeps a new block only once {gpu} requests have "
                     f"referenced it (kvtier_gpu_sightings={gpu}, replayed under vLLM's semantics beside "
                     "caching every block): kvtier's connector applies it (kv_connector "
                     f"{KVTIER_CONNECTOR} from {KVTIER_CONNECTOR_MODULE}, kvtier installed in "
                     "the engine's environment); vLLM's own connector has no such setting")
    if cpu_bytes != choices.cpu_tier_bytes:
        notes.append(f"cpu_tier_bytes is {cpu_bytes} for vLLM ({choices.cpu_tier_bytes} beyond "
                     "the GPU tier): vLLM's CPU tier also holds a copy of the blocks it stores "
                     "from the GPU")
    file_tier = choices.file_tier
    if file_tier is not None:
        notes.append(f"candidate file tier of {file_tier.size_bytes} bytes: {file_tier.reason}")
        if file_tier.add and not file_tier.path:
            notes.append("the file tier is not written to the config: give --cold-path DIR (an "
                         "absolute path on the file system kvtier probe fs measured)")
        elif file_tier.add:
            notes.append("with the file tier store_threshold is 0: vLLM's "
                         "TieringOffloadingSpec refuses any other")
            # TieringOffloadingSpec refuses store_threshold >= 2; the gain was replayed at 0
            return EngineSettings(cpu_tier_bytes=cpu_bytes, eviction_policy=policy,
                                  store_threshold=0, gpu_sightings=gpu,
                                  cold_tier_bytes=file_tier.size_bytes,
                                  cold_tier_path=file_tier.path, kv_events=True), tuple(notes)
    return EngineSettings(cpu_tier_bytes=cpu_bytes, eviction_policy=policy,
                          store_threshold=store_threshold, gpu_sightings=gpu,
                          kv_events=True), tuple(notes)


def validate(settings: EngineSettings) -> None:
    """Raise ``ValueError`` for values vLLM 0.33.0 cannot take."""
    if settings.eviction_policy not in (None, *EVICTION_POLICIES):
        raise ValueError(f"vLLM eviction_policy {settings.eviction_policy!r} is not one of "
                         f"{', '.join(EVICTION_POLICIES)}")
    if settings.cpu_tier_bytes == 0 and settings.cold_tier_bytes:
        raise ValueError("cold_tier_bytes > 0 with cpu_tier_bytes=0: vLLM's secondary tiers "
                         "sit behind the CPU tier; keep a CPU tier or set cold_tier_bytes 0")
    if (settings.cold_tier_path and settings.cold_tier_bytes != 0
            and settings.store_threshold and settings.store_threshold >= 2):
        raise ValueError(f"store_threshold={settings.store_threshold} with a secondary tier: "
                         "vLLM's TieringOffloadingSpec rejects store_threshold >= 2; use 0")


def transfer_config(settings: EngineSettings, existing: dict | None = None, *,
                    force: bool = False) -> dict:
    """The ``--kv-transfer-config`` object: ``existing`` with the offload settings set (see
    the module for what is kept); ``force`` replaces a connector that is not an offloading one."""
    validate(settings)
    config = dict(existing or {})
    _keep_or_replace_connector(config, force, kvtier=bool(settings.gpu_sightings))
    config["kv_role"] = "kv_both"
    extra = _extra_config(config)
    _apply_gpu_sightings(settings, config, extra)
    cpu_bytes = ZERO_CPU_BYTES if settings.cpu_tier_bytes == 0 else settings.cpu_tier_bytes
    for key, value in (("cpu_bytes_to_use", cpu_bytes),
                       ("eviction_policy", settings.eviction_policy),
                       ("store_threshold", settings.store_threshold),
                       ("block_size", settings.block_size_tokens)):
        if value is not None:
            extra[key] = value
    if "cpu_bytes_to_use" not in extra:
        raise ValueError("vLLM's OffloadingConnector needs cpu_tier_bytes (cpu_bytes_to_use)")
    _apply_cold_tier(settings, extra)
    threshold = extra.get("store_threshold", 0)  # a bad type is named by the shape check
    if _is_tiering(extra) and isinstance(threshold, int) and threshold >= 2:
        raise ValueError("the file's secondary tier and store_threshold >= 2 conflict: "
                         "vLLM's tiering spec rejects it; set store_threshold 0")
    config["kv_connector_extra_config"] = extra
    return config


def _keep_or_replace_connector(config: dict, force: bool, kvtier: bool = False) -> None:
    """``kvtier``: the settings need kvtier's connector (a new file loads it)."""
    name, path = config.get("kv_connector"), config.get("kv_connector_module_path")
    if name is None and path is None:
        config["kv_connector"] = KVTIER_CONNECTOR if kvtier else NATIVE_CONNECTOR
        if kvtier:
            config["kv_connector_module_path"] = KVTIER_CONNECTOR_MODULE
        return
    if (name == NATIVE_CONNECTOR and path is None) or name in KVTIER_CONNECTORS.get(path, ()):
        return
    if not force:
        where = f" from {path}" if path is not None else ""
        raise ConfigFileError(
            f"kv_connector is {name!r}{where}, not an offloading connector kvtier writes "
            f"({NATIVE_CONNECTOR}, or kvtier's KvtierOffloadingConnector): add --force to "
            f"replace it with {NATIVE_CONNECTOR}")
    config["kv_connector"] = NATIVE_CONNECTOR
    config.pop("kv_connector_module_path", None)


def _apply_gpu_sightings(settings: EngineSettings, config: dict, extra: dict) -> None:
    if settings.gpu_sightings is None:
        return
    if not settings.gpu_sightings:
        extra.pop(GPU_SIGHTINGS_KEY, None)
        return
    if config.get("kv_connector_module_path") != KVTIER_CONNECTOR_MODULE:
        raise ConfigFileError(
            f"gpu_sightings={settings.gpu_sightings} needs kvtier's connector, and the file "
            f"loads {config.get('kv_connector')!r}: set kv_connector {KVTIER_CONNECTOR!r} and "
            f"kv_connector_module_path {KVTIER_CONNECTOR_MODULE!r} (kvtier installed in the "
            "engine's environment), or push gpu_sightings 0")
    extra[GPU_SIGHTINGS_KEY] = settings.gpu_sightings


def _extra_config(config: dict) -> dict:
    extra = config.get("kv_connector_extra_config")
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ConfigFileError(f"kv_connector_extra_config must be a mapping of keys (a JSON "
                              f"object), got {type(extra).__name__} {extra!r:.60}; fix it first")
    return dict(extra)


def _spec_family(extra: dict) -> tuple[str, str]:
    path = extra.get("spec_module_path")
    family = SPEC_FAMILIES.get(path)
    if family is None or extra.get("spec_name", family[0]) not in family:
        raise ConfigFileError(
            f"spec_name {extra.get('spec_name')!r} (spec_module_path {path!r}) is not a spec "
            "kvtier can move between one tier and two (vLLM's, or kvtier's from "
            f"{', '.join(KVTIER_SPECS)}); change the tiers by hand")
    return family


def _is_tiering(extra: dict) -> bool:
    family = SPEC_FAMILIES.get(extra.get("spec_module_path"))
    return family is not None and extra.get("spec_name") == family[1]


def _apply_cold_tier(settings: EngineSettings, extra: dict) -> None:
    if settings.cold_tier_bytes == 0 or settings.cpu_tier_bytes == 0:
        extra.pop("secondary_tiers", None)
        if _is_tiering(extra):
            extra["spec_name"] = _spec_family(extra)[0]
    elif settings.cold_tier_path is not None:
        extra["spec_name"] = _spec_family(extra)[1]
        tiers = extra.get("secondary_tiers", [])
        if not isinstance(tiers, list) or not all(isinstance(t, dict) for t in tiers):
            raise ConfigFileError(f"secondary_tiers must be a list of mappings, got {tiers!r:.60}")
        tiers = [t for t in tiers if t.get("type") != "fs"]
        extra["secondary_tiers"] = tiers + [{"type": "fs", "root_dir": settings.cold_tier_path,
                                             "enable_kv_events": True}]


def events_config(settings: EngineSettings, existing: dict | None) -> dict:
    """The ``--kv-events-config`` object: ``existing`` with events switched on or off; its
    endpoints are kept, and none is added (vLLM's default, or the file's, stays)."""
    config = dict(existing or {})
    config["enable_kv_cache_events"] = bool(settings.kv_events)
    if settings.kv_events and config.get("publisher") == "null":
        config["publisher"] = "zmq"
    return config


def render(settings: EngineSettings, existing: str | None, suffix: str, *,
           force: bool = False) -> Rendered:
    """The new file text for a ``suffix`` file whose current text is ``existing``."""
    if suffix == ".json":
        if existing is not None and not existing.strip():
            raise ConfigFileError("the file is empty; a --kv-transfer-config file holds a JSON "
                                  "object: write {} in it, or remove it to start a new one")
        current = _json_object(existing, "the file") if existing is not None else None
        config = transfer_config(settings, current, force=force)
        notes = (_checked(config, None) + ", unless vllm serve is also given "
                 "--kv-offloading-size: with it vLLM overrides this connector and size, so "
                 "leave it out",) + _notes(settings)
        if settings.kv_events:
            notes += (f"kv_events: KV events are a separate flag; add {EVENTS_LINE}",)
        return Rendered(json.dumps(config, indent=2) + "\n", notes)
    if suffix in (".yaml", ".yml"):
        return _render_yaml(settings, existing or "", force)
    raise ValueError(f"vLLM config files are {', '.join(FORMATS)}, got {suffix!r}")


def _render_yaml(settings: EngineSettings, existing: str, force: bool) -> Rendered:
    doc = YamlDoc(existing, spellings=True)
    shorthand = offloading.read(doc)
    raws = {key: doc.get((key,)) for key in ("kv-transfer-config", "kv-events-config")}
    currents = {key: _config_object(raw, key) for key, raw in raws.items()}
    notes = ()
    if shorthand.size_gib is not None:  # vLLM would override the transfer config with it
        currents["kv-transfer-config"], moved = offloading.take_over(
            doc, currents["kv-transfer-config"], shorthand, force)
        notes += (moved,)
    updates, values = {}, {}
    for key, current in currents.items():
        if key == "kv-transfer-config":
            value = transfer_config(settings, current, force=force)
        elif settings.kv_events is not None and current is not None:
            value = events_config(settings, current)
        else:  # no events settings in the file: nothing to switch, no endpoint to invent
            values[key] = current
            continue
        values[key] = value
        updates[(key,)] = value if isinstance(raws[key], dict) else json.dumps(value)  # the file's style
    notes += (_checked(values["kv-transfer-config"], values["kv-events-config"]),) + _notes(settings)
    if settings.kv_events and values["kv-events-config"] is None:
        notes += (f"kv_events: the file has no kv-events-config, none added; add {EVENTS_LINE}",)
    doc.set(updates)
    return Rendered(doc.text(), notes)


def _config_object(raw, key: str) -> dict | None:
    current = _json_object(raw, key) if isinstance(raw, str) and raw.strip() else raw
    if current is not None and not isinstance(current, dict):
        raise ConfigFileError(f"{key} must be a JSON object or a mapping, got {raw!r}")
    return current


def _checked(transfer: dict, events: dict | None) -> str:
    """Refuse a config vLLM would not boot, or one whose connector or size vLLM would not
    run as written; returns the note saying what vLLM will run."""
    try:
        check(transfer, events)
    except ShapeError as error:
        raise ConfigFileError(f"the pushed config would not boot vLLM: {error}") from None
    runs = resolve(transfer)
    written = transfer["kv_connector_extra_config"]["cpu_bytes_to_use"]
    if runs.connector != transfer["kv_connector"] or runs.cpu_bytes != written:
        raise ConfigFileError(f"vLLM would run {runs.sentence()}, not the {transfer['kv_connector']} "
                              f"with cpu_bytes_to_use={written} written; push it by hand")
    return f"vLLM will run {runs.sentence()}"


def _json_object(text: str, what: str) -> dict:
    try:
        value = load_json(text, what)
    except NotReadable as error:  # nested too deep
        raise ConfigFileError(str(error)) from None
    except ValueError as error:
        raise ConfigFileError(f"{what} is not valid JSON ({error}); fix it first") from None
    if not isinstance(value, dict):
        raise ConfigFileError(f"{what} must hold a JSON object (the --kv-transfer-config "
                              f"object), got {type(value).__name__}")
    return value


def _notes(settings: EngineSettings) -> tuple[str, ...]:
    notes = []
    if settings.cpu_tier_bytes == 0:
        notes.append(f"cpu_tier_bytes=0: cpu_bytes_to_use={ZERO_CPU_BYTES} (zero CPU chunks, "
                     "nothing offloaded); the connector and spec stay loaded, so kvtier's "
                     "plug-ins keep recording")
    if settings.cold_tier_bytes:
        notes.append(f"vLLM 0.33.0's fs tier has no capacity limit (vllm#54779): "
                     f"cold_tier_bytes={settings.cold_tier_bytes} is not enforced; watch "
                     f"{settings.cold_tier_path}")
    ignored = [f for f in ("offload_min_priority", "save_priority_limit", "write_policy")
               if getattr(settings, f) is not None]
    if ignored:
        notes.append(f"not applicable to vLLM, ignored: {', '.join(ignored)}")
    return tuple(notes)
