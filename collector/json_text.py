"""JSON text as kvtier writes it everywhere (files, ``--json`` output, HTTP bodies): strict,
so any JSON parser reads it (RFC 8259 has no NaN or Infinity; Python's ``json`` writes them
by default, and browsers' ``JSON.parse``, ``jq`` and most other parsers refuse them).

A float that is not finite (an unknown percentile, a ratio over zero) is written as ``null``;
numpy scalars and arrays as their Python values; anything else JSON has no form for raises
``TypeError`` naming its type. Standard library only: the engine-side plug-ins use it too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def dumps(value, *, indent: int | None = None, separators: tuple[str, str] | None = None,
          sort_keys: bool = False) -> str:
    """``value`` as strict JSON text (see the module)."""
    options = dict(indent=indent, separators=separators, sort_keys=sort_keys, allow_nan=False,
                   default=_plain)
    try:
        return json.dumps(value, **options)
    except ValueError:  # a NaN or infinity somewhere: the rare path walks the value once
        return json.dumps(_finite(value), **options)


def write(path: str | Path, value, *, indent: int | None = 2) -> Path:
    """Write ``value`` to ``path`` as strict JSON text and a final newline; returns the path."""
    path = Path(path)
    path.write_text(dumps(value, indent=indent) + "\n")
    return path


def _plain(value):
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _finite(value):
    """``value`` with every non-finite float (numpy's too) as ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _finite(value.tolist())
    return value
