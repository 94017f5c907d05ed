"""The ``kvtier_*`` keys kvtier's vLLM plug-ins read from ``kv_connector_extra_config``.

vLLM hands its extra config to every connector and offloading spec and ignores keys it does
not know, so this is the one channel for configuring kvtier inside the engine:

=========================  =================================================================
``kvtier_instance``        the serving instance's name in kvtier's records (default: the
                           engine id)
``kvtier_collector``       where to ship records: a ZMQ endpoint of ``kvtier collect --hooks``
                           (default: ``$KVTIER_COLLECTOR``, else ``tcp://127.0.0.1:5570``), or
                           ``in-process`` for an application that drains
                           its engine's ``kvtier.probes.vllm.recorders.recorder_for(engine_id)``
``kvtier_ship_interval_s`` how often the shipper drains the recorders (default 0.25)
``kvtier_flush_timeout_s`` how long a shutdown flush may wait for a collector (default 2.0)
``kvtier_tier_config``     the tier configuration stamped on every request record (a client's
                           ``kv_transfer_params`` still overrides it per request); default: the
                           offload settings in the rollout's form, ``gpu+cpu:<cpu bytes>``,
                           ``gpu+cpu+file:<cpu bytes>`` with a secondary ``fs`` tier
``kvtier_control_token``   the token shared with ``kvtier collect --guardrail``: with it (or
                           ``kvtier_control_token_file``, a file holding it) the connector
                           listens to the collector's control channel; without, nothing can
                           pause a tier in this engine
``kvtier_control``         the collector's control endpoint (default ``tcp://127.0.0.1:5571``)
``kvtier_control_lease_s`` how long a state holds without word from the collector before the
                           engine returns to its configured tiers (default 30)
``kvtier_gpu_sightings``   cache a block in the GPU prefix cache only from the N-th request
                           that references it (N >= 2; default 0: every block, as vLLM does;
                           ``probes/vllm/gpu_filter.py``)
=========================  =================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.collector.control import DEFAULT_CONTROL_ENDPOINT, check_token
from kvtier.collector.control_receiver import ReceiverConfig
from kvtier.collector.shipper import ShipperConfig, endpoint_from

IN_PROCESS = "in-process"


@dataclass(frozen=True)
class ControlKeys:
    """The control channel's settings, before the engine's instance name is known."""

    token: bytes = field(repr=False)
    endpoint: str = DEFAULT_CONTROL_ENDPOINT
    lease_s: float = 30.0

    def receiver(self, instance: str) -> ReceiverConfig:
        return ReceiverConfig(instance, self.token, self.endpoint, self.lease_s)


@dataclass(frozen=True)
class HookSettings:
    """Validated ``kvtier_*`` settings; ``shipper`` is ``None`` for ``in-process``."""

    instance: str | None = None
    shipper: ShipperConfig | None = ShipperConfig()
    tier_config: str | None = None
    control: ControlKeys | None = None
    gpu_sightings: int = 0

    @classmethod
    def from_extra_config(cls, extra: Mapping | None) -> "HookSettings":
        """Read the keys above; ``ValueError`` naming the key for a bad value."""
        extra = extra or {}
        instance = extra.get("kvtier_instance")
        if instance is not None and (not isinstance(instance, str) or not instance):
            raise ValueError(f"kvtier_instance must be a non-empty string, got {instance!r}")
        tier_config = extra.get("kvtier_tier_config")
        if tier_config is None:
            tier_config = offload_tier_config(extra)
        elif not isinstance(tier_config, str) or not tier_config:
            raise ValueError(f"kvtier_tier_config must be a non-empty string, got {tier_config!r}")
        control = _control(extra)
        gpu_sightings = extra.get("kvtier_gpu_sightings", 0)
        if (isinstance(gpu_sightings, bool) or not isinstance(gpu_sightings, int)
                or gpu_sightings < 0 or gpu_sightings == 1):
            raise ValueError(f"kvtier_gpu_sightings must be 0 (cache every block) or an int "
                             f">= 2, got {gpu_sightings!r}")
        collector = extra.get("kvtier_collector")
        if collector == IN_PROCESS:
            return cls(instance, None, tier_config, control, gpu_sightings)
        try:
            shipper = ShipperConfig(
                endpoint=endpoint_from(collector),
                interval_s=_seconds(extra, "kvtier_ship_interval_s", 0.25),
                flush_timeout_s=_seconds(extra, "kvtier_flush_timeout_s", 2.0))
        except ValueError as error:
            raise ValueError(f"kv_connector_extra_config: {error}") from None
        return cls(instance, shipper, tier_config, control, gpu_sightings)

    def tags(self, client_tags: Mapping, tier_config: str | None = None) -> dict:
        """A request record's tags: the engine's tier configuration (``tier_config``, the one
        in force when the request was admitted, else the configured one), then the client's
        (whose ``tier_config_id`` overrides it)."""
        config = tier_config or self.tier_config
        stamped = {} if config is None else {"tier_config_id": config}
        return {**stamped, **client_tags}


# A secondary tier's type as the rollout names its tier (kvtier.rollout.plan: gpu+cpu+file).
_TIER_NAMES = {"fs": "file"}


def offload_tier_config(extra: Mapping) -> str | None:
    """The tier configuration vLLM's offload settings describe, in the rollout's form:
    ``gpu+cpu:<cpu_bytes_to_use>``, each secondary tier added by type (``fs`` as ``file``);
    ``None`` without a CPU tier size (vLLM refuses such a config anyway)."""
    cpu_bytes = extra.get("cpu_bytes_to_use")
    if isinstance(cpu_bytes, bool) or not isinstance(cpu_bytes, (int, float)) or cpu_bytes <= 0:
        return None
    tiers = ["gpu", "cpu"]
    for tier in extra.get("secondary_tiers") or ():
        kind = tier.get("type") if isinstance(tier, Mapping) else None
        if isinstance(kind, str) and kind:
            tiers.append(_TIER_NAMES.get(kind, kind))
    return f"{'+'.join(tiers)}:{int(cpu_bytes)}"


def _seconds(extra: Mapping, key: str, default: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{key} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _control(extra: Mapping) -> ControlKeys | None:
    token, path = extra.get("kvtier_control_token"), extra.get("kvtier_control_token_file")
    if token is None and path is None:
        return None
    try:
        if path is not None:
            token = Path(path).read_text().strip()
        if not isinstance(token, str):
            raise ValueError(f"kvtier_control_token must be a string, got {type(token).__name__}")
        endpoint = extra.get("kvtier_control", DEFAULT_CONTROL_ENDPOINT)
        keys = ControlKeys(check_token(token.encode()), endpoint,
                           _seconds(extra, "kvtier_control_lease_s", 30.0))
        keys.receiver("check")  # the endpoint's form, now rather than at the first request
        return keys
    except (OSError, ValueError) as error:
        raise ValueError(f"kv_connector_extra_config: {getattr(error, 'strerror', None) or error}") from None
