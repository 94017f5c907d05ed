"""Will vLLM boot with this config? The checks a pushed ``--kv-transfer-config`` and
``--kv-events-config`` must pass before the file is written.

vLLM resolves a connector and an offloading spec by name, or by ``getattr`` on a module path
when one is given (``KVConnectorFactory``, ``OffloadingSpecFactory``, vLLM 0.32 and 0.33): a
name the module does not have stops the engine at start-up. :func:`check` holds a pushed
config to those rules without vLLM (kvtier's own plug-in modules and the names they
provide are known here), and, where vLLM is importable, also builds vLLM's own
``KVTransferConfig`` and ``KVEventsConfig`` from it. Keys kvtier does not write are checked
only for their type, so a file written for another vLLM version keeps its own keys.

:func:`resolve` says which connector and how many CPU bytes vLLM will run with: vLLM 0.33's
``VllmConfig._post_init_kv_transfer_config`` lets ``--kv-offloading-size`` (GiB, the total
over the tensor-parallel ranks) and ``--kv-offloading-backend`` override the transfer
config's connector and ``cpu_bytes_to_use`` (native: ``OffloadingConnector``, or
``SimpleCPUOffloadConnector`` with ``VLLM_USE_SIMPLE_KV_OFFLOAD=1``; lmcache:
``LMCacheMPConnector``, its size left to LMCache). Where vLLM is importable, vLLM's own
``CacheConfig``, ``KVTransferConfig`` and that method work it out; elsewhere kvtier's reading
of the same method does.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
PUBLISHERS = ("null", "zmq")
# module path -> the names vLLM finds there (kvtier's plug-ins, probes/vllm/); specs are
# listed as (the CPU spec, the CPU + secondary-tier spec), as vLLM's own pair is
KVTIER_CONNECTORS = {"kvtier.probes.vllm.connector": ("KvtierOffloadingConnector",)}
KVTIER_SPECS = {"kvtier.probes.vllm.spec": ("KvtierCPUOffloadingSpec", "KvtierTieringOffloadingSpec")}
VLLM_SPECS = ("CPUOffloadingSpec", "TieringOffloadingSpec")  # registered in vLLM's factory
OFFLOADING_CONNECTORS = ("OffloadingConnector", "KvtierOffloadingConnector")


OFFLOADING_BACKENDS = ("native", "lmcache")  # vLLM 0.33's KVOffloadingBackend
SIMPLE_SWITCH = "VLLM_USE_SIMPLE_KV_OFFLOAD"
BY_KVTIER = "kvtier's reading of vLLM 0.33's VllmConfig"


@dataclass(frozen=True)
class Shorthand:
    """vLLM's offloading shorthand: ``--kv-offloading-size`` in GiB (the total over the
    tensor-parallel ranks; ``None``: not given, the transfer config is used as written),
    ``--kv-offloading-backend``, and whether ``VLLM_USE_SIMPLE_KV_OFFLOAD`` is on."""

    size_gib: float | None = None
    backend: str = "native"
    simple: bool = False

    @classmethod
    def from_environment(cls, size_gib: float | None = None, backend: str = "native") -> "Shorthand":
        """With the switch as this process's environment sets it (as ``vllm.envs`` reads it)."""
        try:
            simple = bool(int(os.environ.get(SIMPLE_SWITCH, "0")))
        except ValueError:
            simple = False
        return cls(size_gib, backend, simple)


@dataclass(frozen=True)
class Resolved:
    """The connector (and its module path) and ``cpu_bytes_to_use`` vLLM runs with, and what
    worked them out (vLLM's own classes, or :data:`BY_KVTIER`)."""

    connector: str | None
    module_path: str | None
    cpu_bytes: int | float | None
    by: str

    def sentence(self) -> str:
        size = "no cpu_bytes_to_use" if self.cpu_bytes is None else (
            f"cpu_bytes_to_use={self.cpu_bytes:.0f} ({self.cpu_bytes / 2**30:.2f} GiB over the ranks)"
            if isinstance(self.cpu_bytes, (int, float)) else f"cpu_bytes_to_use={self.cpu_bytes!r:.40}")
        where = f" from {self.module_path}" if self.module_path else ""
        return f"{self.connector}{where} with {size}, per {self.by}"


def resolve(transfer: Mapping | None, shorthand: Shorthand = Shorthand()) -> Resolved:
    """What vLLM runs with, given the transfer config and the shorthand (see the module)."""
    if importlib.util.find_spec("vllm") is not None:
        resolved = _resolve_with_vllm(transfer, shorthand)
        if resolved is not None:
            return resolved
    return resolve_as_kvtier_reads_vllm(transfer, shorthand)


def resolve_as_kvtier_reads_vllm(transfer: Mapping | None, shorthand: Shorthand) -> Resolved:
    """:func:`resolve` without vLLM: its ``_post_init_kv_transfer_config``, as kvtier reads it."""
    config = dict(transfer or {})
    connector, path = config.get("kv_connector"), config.get("kv_connector_module_path")
    cpu_bytes = dict(config.get("kv_connector_extra_config") or {}).get("cpu_bytes_to_use")
    if shorthand.size_gib is not None and shorthand.backend == "native":
        connector = "SimpleCPUOffloadConnector" if shorthand.simple else "OffloadingConnector"
        cpu_bytes = shorthand.size_gib * (1 << 30)
    elif shorthand.size_gib is not None and shorthand.backend == "lmcache":
        connector = "LMCacheMPConnector"
    return Resolved(connector, path, cpu_bytes, BY_KVTIER)


def _resolve_with_vllm(transfer: Mapping | None, shorthand: Shorthand) -> Resolved | None:
    """vLLM's own ``_post_init_kv_transfer_config`` on a stand-in holding just the two
    configs it reads (a whole ``VllmConfig`` needs a model); ``None`` if vLLM is broken."""
    from types import SimpleNamespace

    try:
        from vllm.config import CacheConfig, KVTransferConfig, VllmConfig
        from vllm.version import __version__
    except ImportError:
        return None
    if not hasattr(VllmConfig, "_post_init_kv_transfer_config"):  # not 0.32 or 0.33
        return None
    try:
        holder = SimpleNamespace(
            cache_config=CacheConfig(kv_offloading_size=shorthand.size_gib,
                                     kv_offloading_backend=shorthand.backend),
            kv_transfer_config=None if transfer is None else KVTransferConfig(**transfer))
    except (TypeError, ValueError):  # a config vLLM refuses: check() names why
        return None
    saved = os.environ.get(SIMPLE_SWITCH)
    os.environ[SIMPLE_SWITCH] = "1" if shorthand.simple else "0"  # vllm.envs reads it per use
    try:
        VllmConfig._post_init_kv_transfer_config(holder)
    finally:
        if saved is None:
            del os.environ[SIMPLE_SWITCH]
        else:
            os.environ[SIMPLE_SWITCH] = saved
    result, by = holder.kv_transfer_config, f"vLLM {__version__}'s own config classes"
    if result is None:
        return Resolved(None, None, None, by)
    return Resolved(result.kv_connector, result.kv_connector_module_path,
                    result.kv_connector_extra_config.get("cpu_bytes_to_use"), by)


class ShapeError(ValueError):
    """The config would not boot vLLM; the message names the key and what to do."""


def check(transfer: Mapping, events: Mapping | None = None) -> None:
    """Raise :class:`ShapeError` for a transfer (and KV-events) config vLLM would refuse."""
    _check_transfer(transfer)
    if events is not None:
        _check_events(events)
    if importlib.util.find_spec("vllm") is not None:
        _check_with_vllm(transfer, events)


def _check_transfer(transfer: Mapping) -> None:
    connector, path = transfer.get("kv_connector"), transfer.get("kv_connector_module_path")
    if not isinstance(connector, str) or not connector:
        raise ShapeError(f"kv_connector must name a connector class, got {connector!r}")
    if transfer.get("kv_role") not in KV_ROLES:
        raise ShapeError(f"kv_role {transfer.get('kv_role')!r} is not one of {', '.join(KV_ROLES)}")
    if path is not None:
        _check_module_name("kv_connector", connector, "kv_connector_module_path", path,
                           KVTIER_CONNECTORS)
    extra = transfer.get("kv_connector_extra_config", {})
    if not isinstance(extra, Mapping):
        raise ShapeError(f"kv_connector_extra_config must be a mapping, got {type(extra).__name__}")
    if connector in OFFLOADING_CONNECTORS:
        _check_offloading(extra)


def _check_module_name(name_key: str, name, path_key: str, path, known: dict) -> None:
    if not isinstance(path, str) or not path:
        raise ShapeError(f"{path_key} must be a module path, got {path!r}")
    provided = known.get(path)
    if provided is not None and name not in provided:
        raise ShapeError(f"{name_key} {name!r} is not in {path} ({path_key}); it provides "
                         f"{', '.join(provided)}: vLLM would stop at start-up")


def _check_offloading(extra: Mapping) -> None:
    spec, path = extra.get("spec_name", "CPUOffloadingSpec"), extra.get("spec_module_path")
    if path is not None:
        _check_module_name("spec_name", spec, "spec_module_path", path, KVTIER_SPECS)
    elif spec not in VLLM_SPECS:
        raise ShapeError(f"spec_name {spec!r} is not one of vLLM's ({', '.join(VLLM_SPECS)}) "
                         "and no spec_module_path says where it is")
    size = extra.get("cpu_bytes_to_use")
    if not size or _as_int(size) is None or _as_int(size) < 0:  # vLLM: truthy, then int()
        raise ShapeError(f"cpu_bytes_to_use must be a number of bytes > 0, got {size!r}")
    threshold = _as_int(extra.get("store_threshold", 0))  # vLLM: int()
    if threshold is None:
        raise ShapeError(f"store_threshold must be an int, got {extra.get('store_threshold')!r}")
    tiering = spec in ("TieringOffloadingSpec", "KvtierTieringOffloadingSpec")
    if tiering and threshold >= 2:
        raise ShapeError(f"store_threshold={threshold} with {spec}: vLLM rejects it; use 0")
    tiers = extra.get("secondary_tiers", [])
    if not isinstance(tiers, list) or not all(isinstance(t, Mapping) and t.get("type") for t in tiers):
        raise ShapeError(f"secondary_tiers must be a list of mappings with a type, got {tiers!r}")
    if tiers and not tiering:
        raise ShapeError(f"secondary_tiers with spec_name {spec!r}: only a tiering spec reads them")


def _as_int(value) -> int | None:
    """``int(value)`` as vLLM takes it, or ``None`` where that raises."""
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _check_events(events: Mapping) -> None:
    enabled = events.get("enable_kv_cache_events", False)
    if not isinstance(enabled, bool):
        raise ShapeError(f"enable_kv_cache_events must be true or false, got {enabled!r}")
    publisher = events.get("publisher")
    if publisher is not None and publisher not in PUBLISHERS:
        raise ShapeError(f"KV-events publisher {publisher!r} is not one of {', '.join(PUBLISHERS)}")
    for key in ("endpoint", "replay_endpoint", "topic"):
        if events.get(key) is not None and not isinstance(events[key], str):
            raise ShapeError(f"KV-events {key} must be a string, got {events[key]!r}")


def _check_with_vllm(transfer: Mapping, events: Mapping | None) -> None:
    try:
        from vllm.config import KVEventsConfig, KVTransferConfig
    except ImportError:  # a broken or partial vLLM: the checks above stand
        return
    for cls, value in ((KVTransferConfig, transfer), (KVEventsConfig, events)):
        if value is None:
            continue
        try:
            cls(**value)
        except (TypeError, ValueError) as error:
            why = " ".join(line.strip() for line in str(error).strip().splitlines()[:3])
            raise ShapeError(f"vLLM's {cls.__name__} refuses it: {why or type(error).__name__}") from None
