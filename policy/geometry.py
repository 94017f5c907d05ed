"""KV geometry (bytes per token and per block) and capacity parsing for tier sizes.

A token's KV cache holds a key and a value vector per layer and KV head:
``2 * layers * kv_heads * head_dim * dtype_bytes`` bytes.

Every geometry says where it came from (``source``): ``measured`` (the bytes an engine's
block events carried, :func:`recorded_bytes_per_token`), ``calibrated`` (a ``kvtier
calibrate`` file), ``given`` (a model name or a byte count the operator passed) or
``default`` (a documented model's shape, assumed): reports name the defaults they rest on.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


GEOMETRY_SOURCES = ("measured", "calibrated", "given", "default")


@dataclass(frozen=True)
class KVGeometry:
    """A model's KV-cache shape. ``dtype_bytes`` is 2 for bf16/fp16, 1 for fp8; ``source``
    is one of :data:`GEOMETRY_SOURCES`."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    source: str = "default"

    def __post_init__(self) -> None:
        for field_name in ("layers", "kv_heads", "head_dim", "dtype_bytes"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field_name} must be a positive int, got {value!r}")
        if self.source not in GEOMETRY_SOURCES:
            raise ValueError(f"source must be one of {', '.join(GEOMETRY_SOURCES)}, "
                             f"got {self.source!r}")

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def block_bytes(self, block_tokens: int) -> int:
        return self.bytes_per_token * block_tokens

    @property
    def words(self) -> str:
        """``"2,048 bytes per token (measured: ...)"``: the figure and where it came from."""
        return f"{self.bytes_per_token:,} KV bytes per token ({self.source}: {self.name})"


# Public model configs (config.json: num_hidden_layers, num_key_value_heads, head_dim), bf16.
GEOMETRIES: dict[str, KVGeometry] = {
    g.name: g for g in (
        KVGeometry("llama-3.1-8b", layers=32, kv_heads=8, head_dim=128),
        KVGeometry("llama-3.1-70b", layers=80, kv_heads=8, head_dim=128),
        KVGeometry("qwen2.5-7b", layers=28, kv_heads=4, head_dim=128),
        KVGeometry("qwen2.5-72b", layers=80, kv_heads=8, head_dim=128),
        # kvtier's reference engine with its defaults (refengine/config.py EngineConfig:
        # 2 layers, 2 heads, head_dim 16, float32): what `kvtier demo` measures
        KVGeometry("kvtier-reference", layers=2, kv_heads=2, head_dim=16, dtype_bytes=4),
    )
}
DEFAULT_GEOMETRY = "llama-3.1-8b"


def geometry(name: str) -> KVGeometry:
    """A named geometry; ``ValueError`` naming the known ones otherwise."""
    try:
        return GEOMETRIES[name]
    except KeyError:
        raise ValueError(f"unknown model geometry {name!r}; known: {', '.join(GEOMETRIES)}") from None


def geometry_for(bytes_per_token: int, name: str = "measured", source: str = "measured"
                 ) -> KVGeometry:
    """A KV geometry with exactly ``bytes_per_token`` (a key and a value: an even number)."""
    if isinstance(bytes_per_token, bool) or not isinstance(bytes_per_token, int) \
            or bytes_per_token <= 0 or bytes_per_token % 2:
        raise ValueError(f"KV bytes per token must be a positive even number (a key and a "
                         f"value per token), got {bytes_per_token!r}")
    return KVGeometry(name, layers=1, kv_heads=1, head_dim=bytes_per_token // 2, dtype_bytes=1,
                      source=source)


def recorded_bytes_per_token(reader, block_tokens: int) -> KVGeometry | None:
    """The geometry an engine's block events record behind ``reader`` (a store's or a
    segment folder's reader), ``None`` for a trace or events without bytes."""
    from kvtier.collector.event_rows import recorded_kv_bytes

    found = recorded_kv_bytes(reader, block_tokens)
    if found is None:
        return None
    per_token, how, where = found
    return geometry_for(per_token, f"the block events in {where}, {how}", "measured")


_DECIMAL = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BYTES = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_capacity_tokens(text: str, model: KVGeometry | None = None) -> float:
    """Tokens from ``"4e6"``, ``"10M"`` (tokens, decimal suffixes), ``"16GiB"``/``"2GB"``
    (bytes, needs a geometry) or ``"inf"``/``"unlimited"`` (``math.inf``)."""
    if text.strip().lower() in ("inf", "unlimited", "none"):
        return math.inf
    match = _PATTERN.match(text)
    if not match:
        raise ValueError(f"bad capacity {text!r}; use a number (4e6), a suffix (10M, 16GiB) or inf")
    value, suffix = float(match.group(1)), match.group(2).lower()
    if not math.isfinite(value):
        raise ValueError(f"bad capacity {text!r}: too large; use a number (4e6), a suffix "
                         "(10M, 16GiB) or inf")
    if suffix in _DECIMAL:
        return math.floor(value * _DECIMAL[suffix])
    if suffix in _BYTES:
        if model is None:
            raise ValueError(f"capacity {text!r} is in bytes; give a model geometry to convert")
        return math.floor(value * _BYTES[suffix] / model.bytes_per_token)
    allowed = ", ".join([s.upper() for s in _DECIMAL if s] + [s for s in _BYTES if s != "b"])
    raise ValueError(f"bad capacity suffix {match.group(2)!r} in {text!r}; allowed: {allowed}, inf")
