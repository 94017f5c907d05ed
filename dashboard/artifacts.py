"""Files other parts of kvtier write that the dashboard shows: what-if results and the
current recommendation. Loading sits behind two functions so the pages do not change when
``kvtier simulate`` and ``kvtier recommend`` settle their output formats.

What-if folder: ``*.json`` files, each a list of points or ``{"points": [...], "chosen":
{"policy": ..., "cpu_capacity_tokens": ...}}``; a point is ``{"policy": str,
"cpu_capacity_tokens": number, "token_hit_ratio": 0..1}``. Policy ``belady`` is the bound.

Recommendation folder: ``recommendation.json`` (an object: ``knob``, ``value``,
``expected_effect``, ``evidence``, optionally ``rollback`` with ``ttft_p99_budget_s`` and
``itl_p99_budget_s``) and the generated engine configs next to it (any other file).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

BOUND_POLICIES = frozenset({"belady"})
RECOMMENDATION_FILE = "recommendation.json"
_CONFIG_SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".toml": "toml", ".py": "python",
                    ".sh": "bash", ".env": "bash", ".txt": "text"}


@dataclass(frozen=True)
class WhatIf:
    """What-if curves: ``points`` has ``policy``, ``cpu_capacity_tokens``,
    ``token_hit_ratio``, ``bound`` (``"bound"``/``"policy"``) and ``chosen`` (bool)."""

    points: pd.DataFrame
    files: tuple[Path, ...]


@dataclass(frozen=True)
class Recommendation:
    fields: dict
    configs: tuple[tuple[str, str, str], ...]  # (file name, language, text)


def load_whatif(folder: Path) -> WhatIf | None:
    """The what-if points under ``folder``; ``None`` when there are none. A malformed file
    raises ``ValueError`` naming it."""
    files = tuple(sorted(folder.glob("*.json"))) if folder.is_dir() else ()
    rows = []
    for path in files:
        rows.extend(_whatif_rows(path))
    if not rows:
        return None
    return WhatIf(pd.DataFrame(rows), files)


def _whatif_rows(path: Path) -> list[dict]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"what-if file {path} is not readable JSON: {error}") from error
    points = doc.get("points", []) if isinstance(doc, dict) else doc
    chosen = doc.get("chosen") if isinstance(doc, dict) else None
    if not isinstance(points, list):
        raise ValueError(f"what-if file {path}: 'points' must be a list")
    return [_point(path, p, chosen) for p in points]


def _point(path: Path, point, chosen) -> dict:
    try:
        policy = str(point["policy"])
        capacity = float(point["cpu_capacity_tokens"])
        ratio = float(point["token_hit_ratio"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"what-if file {path}: point {point!r} needs policy, cpu_capacity_tokens "
                         "and token_hit_ratio") from error
    if not (math.isfinite(capacity) and capacity >= 0 and 0 <= ratio <= 1):
        raise ValueError(f"what-if file {path}: point {point!r} out of range")
    is_chosen = (isinstance(chosen, dict) and chosen.get("policy") == policy
                 and float(chosen.get("cpu_capacity_tokens", -1)) == capacity)
    return {"policy": policy, "cpu_capacity_tokens": capacity, "token_hit_ratio": ratio,
            "bound": "bound" if policy.lower() in BOUND_POLICIES else "policy", "chosen": is_chosen}


def load_recommendation(folder: Path) -> Recommendation | None:
    """The recommendation in ``folder``; ``None`` when there is none."""
    path = folder / RECOMMENDATION_FILE
    if not path.is_file():
        return None
    try:
        fields = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"recommendation file {path} is not readable JSON: {error}") from error
    if not isinstance(fields, dict):
        raise ValueError(f"recommendation file {path} must hold a JSON object")
    configs = tuple((p.name, _CONFIG_SUFFIXES.get(p.suffix, "text"), p.read_text(errors="replace"))
                    for p in sorted(folder.iterdir()) if p.is_file() and p.name != RECOMMENDATION_FILE)
    return Recommendation(fields, configs)
