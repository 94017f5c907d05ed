"""Files other parts of kvtier write that the dashboard shows: what-if results and the
current recommendation. Loading sits behind two functions so the pages do not change when
``kvtier simulate`` and ``kvtier recommend`` settle their output formats.

What-if folder: ``*.json`` files in any of three shapes, normalised to points (``policy``,
``tier``, ``capacity_tokens``, ``token_hit_ratio``, ``bound``, ``chosen``):

* ``kvtier simulate --sweep --policy P --json``: a hit-ratio curve over GPU capacity;
* ``kvtier simulate --gpu-tokens G --cpu-tokens C --policy P --json``: one replay, a point
  on the CPU-capacity curve (on the GPU curve when it has no CPU tier);
* ``{"points": [{"policy", "cpu_capacity_tokens", "token_hit_ratio"}, ...], "chosen":
  {"policy", "cpu_capacity_tokens"}, "note": "how it was replayed"}`` (or a bare list of
  points): a prepared sweep (``kvtier demo`` writes one).

Policy ``belady`` is the bound.

Recommendation folder: ``recommendation.json`` as ``kvtier recommend`` writes it, read
through policy's typed values (:func:`kvtier.policy.recommend.recommendation.from_json`), and the
generated engine configs next to it (any other file).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvtier.collector.exports.recommendation import CALIBRATION_FILE, CHECK_FILE, COST_FILE
from kvtier.policy.recommend.recommendation import Recommendation as TypedRecommendation
from kvtier.policy.recommend.recommendation import from_json

BOUND_POLICIES = frozenset({"belady"})
RECOMMENDATION_FILE = "recommendation.json"
# Engine config files a recommendation folder may hold, and how to highlight them.
CONFIG_LANGUAGES = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".toml": "toml", ".sh": "bash",
                    ".env": "bash", ".args": "bash"}


@dataclass(frozen=True)
class WhatIf:
    """What-if curves: ``points`` has ``policy``, ``tier`` (whose capacity varies),
    ``capacity_tokens``, ``token_hit_ratio``, ``bound`` (``"bound"``/``"policy"``) and
    ``chosen`` (bool)."""

    points: pd.DataFrame
    files: tuple[Path, ...]
    notes: tuple[str, ...] = ()  # what the files say about how they were replayed


@dataclass(frozen=True)
class RecommendationFolder:
    """A recommendation folder: ``rec`` is ``recommendation.json`` read as kvtier's typed
    :class:`kvtier.policy.recommend.recommendation.Recommendation` (``None`` when the file is not in
    that format: ``problem`` says why and ``doc`` holds it raw); ``configs`` are the engine
    configs next to it as (file name, language, text); ``plots`` the report's PNGs;
    ``report`` the text of ``report.md`` if present; ``check`` what ``kvtier recommend
    --check`` last said of it (its ``--json`` object), if it ran; ``calibration`` the engine
    model's held-out check from ``kvtier calibrate`` (``by_tier_config``), when ``recommend``
    was given one with ``--cost-params``."""

    doc: dict
    rec: TypedRecommendation | None
    problem: str | None
    configs: tuple[tuple[str, str, str], ...]
    plots: tuple[Path, ...] = ()
    report: str | None = None
    check: dict | None = None
    calibration: dict | None = None


def load_whatif(folder: Path) -> WhatIf | None:
    """The what-if points under ``folder``; ``None`` when there are none. A malformed file
    raises ``ValueError`` naming it."""
    files = tuple(sorted(folder.glob("*.json"))) if folder.is_dir() else ()
    rows, notes = [], []
    for path in files:
        doc = _read_json(path)
        rows.extend(_whatif_rows(path, doc))
        if isinstance(doc, dict) and isinstance(doc.get("note"), str):
            notes.append(doc["note"])
    if not rows:
        return None
    return WhatIf(pd.DataFrame(rows), files, tuple(notes))


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"what-if file {path} is not readable JSON: {error}") from error


def _whatif_rows(path: Path, doc) -> list[dict]:
    if isinstance(doc, dict) and "curve" in doc:
        return [_point(path, doc.get("policy"), "gpu", p.get("gpu_tokens"), p.get("token_hit_ratio"))
                for p in doc["curve"] if isinstance(p, dict) and p.get("gpu_tokens") is not None]
    if isinstance(doc, dict) and "token_hit_ratio" in doc and "points" not in doc:
        return [_replay_point(path, doc)]
    points = doc.get("points", []) if isinstance(doc, dict) else doc
    chosen = doc.get("chosen") if isinstance(doc, dict) else None
    if not isinstance(points, list):
        raise ValueError(f"what-if file {path}: 'points' must be a list")
    rows = []
    for p in points:
        if not isinstance(p, dict):
            raise ValueError(f"what-if file {path}: point {p!r} is not an object")
        row = _point(path, p.get("policy"), "cpu", p.get("cpu_capacity_tokens"), p.get("token_hit_ratio"))
        row["chosen"] = (isinstance(chosen, dict) and chosen.get("policy") == row["policy"]
                         and _number(chosen.get("cpu_capacity_tokens")) == row["capacity_tokens"])
        rows.append(row)
    return rows


def _replay_point(path: Path, doc: dict) -> dict:
    block_tokens = _number(doc.get("block_tokens")) or 1.0
    tier = "cpu" if doc.get("cpu_blocks") else "gpu"
    blocks = doc.get(f"{tier}_blocks")
    capacity = None if blocks is None else _number(blocks) * block_tokens
    return _point(path, doc.get("policy"), tier, capacity, doc.get("token_hit_ratio"))


def _point(path: Path, policy, tier: str, capacity, ratio) -> dict:
    capacity, ratio = _number(capacity), _number(ratio)
    if not isinstance(policy, str) or capacity is None or ratio is None:
        raise ValueError(f"what-if file {path}: a point needs a policy, a capacity and "
                         f"token_hit_ratio (got policy={policy!r}, capacity={capacity!r}, ratio={ratio!r})")
    if not (math.isfinite(capacity) and capacity >= 0 and 0 <= ratio <= 1):
        raise ValueError(f"what-if file {path}: capacity {capacity!r} or ratio {ratio!r} out of range")
    return {"policy": policy, "tier": tier, "capacity_tokens": capacity, "token_hit_ratio": ratio,
            "bound": "bound" if policy.lower() in BOUND_POLICIES else "policy", "chosen": False}


def _number(value) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def load_recommendation(folder: Path) -> RecommendationFolder | None:
    """The recommendation in ``folder``; ``None`` when there is none. Unreadable JSON raises
    ``ValueError`` naming the file; JSON in another format is kept raw with the reason."""
    path = folder / RECOMMENDATION_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"recommendation file {path} is not readable JSON: {error}") from error
    if not isinstance(doc, dict):
        raise ValueError(f"recommendation file {path} must hold a JSON object")
    try:
        rec, problem = from_json(doc), None
    except ValueError as error:
        rec, problem = None, str(error)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    configs = tuple((p.name, CONFIG_LANGUAGES[p.suffix], p.read_text(errors="replace")) for p in files
                    if p.suffix in CONFIG_LANGUAGES and not p.name.startswith("recommendation")
                    and p.name != COST_FILE)  # kvtier's own files beside it, not engine configs
    report = folder / "report.md"
    return RecommendationFolder(doc, rec, problem, configs,
                                tuple(p for p in files if p.suffix == ".png"),
                                report.read_text(errors="replace") if report.is_file() else None,
                                _listing(folder / CHECK_FILE, "promises"),
                                _listing(folder / CALIBRATION_FILE, "by_tier_config"))


def _listing(path: Path, key: str) -> dict | None:
    """The JSON object in ``path`` when its ``key`` holds a list (``recommend --check``'s
    ``promises``, ``calibrate``'s ``by_tier_config``); ``None`` when the file is absent, cannot
    be read or is of another shape."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and isinstance(body.get(key), list) else None
