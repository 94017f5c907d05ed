"""KV geometry (bytes per token and per block) and capacity parsing for tier sizes.

A token's KV cache holds a key and a value vector per layer and KV head:
``2 * layers * kv_heads * head_dim * dtype_bytes`` bytes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KVGeometry:
    """A model's KV-cache shape. ``dtype_bytes`` is 2 for bf16/fp16, 1 for fp8."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for field_name in ("layers", "kv_heads", "head_dim", "dtype_bytes"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field_name} must be a positive int, got {value!r}")

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def block_bytes(self, block_tokens: int) -> int:
        return self.bytes_per_token * block_tokens


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
