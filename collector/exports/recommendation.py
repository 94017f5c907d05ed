"""The current recommendation as labels for ``kvtier_recommendation_info``.

Reads the ``recommendation.json`` that ``kvtier recommend`` writes, at scrape time, and only
again when the file changes, so a new recommendation shows up without a restart. Once
``kvtier recommend --check`` has judged it, the ``recommendation.check.json`` beside it adds
the label ``promises``: ``held``, ``not_held`` or ``too_few`` (requests to judge it yet).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)
CHECK_FILE = "recommendation.check.json"  # what kvtier recommend --check writes beside it
# the engine model's held-out check from kvtier calibrate, which recommend copies beside it
CALIBRATION_FILE = "recommendation.calibration.json"
COST_FILE = "cost-params.json"  # the costs the recommendation rests on, as calibrate's --out


class RecommendationLabels:
    """Callable for ``KvtierCollector(recommendation=...)``: the verdict and every setting."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._seen: tuple[float, int] | None = None
        self._labels: dict[str, str] | None = None

    def __call__(self) -> dict[str, str] | None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        seen = (stat.st_mtime, stat.st_size, _stamp(self.path.with_name(CHECK_FILE)))
        if self._seen != seen:
            self._seen = seen
            self._labels = self._read()
            if self._labels is not None:
                self._labels.update(_promises(self.path.with_name(CHECK_FILE)))
        return self._labels

    def _read(self) -> dict[str, str] | None:
        try:
            data = json.loads(self.path.read_text())
            settings = data.get("settings", data)
            labels = {key: _text(value) for key, value in settings.items()}
            verdict = data.get("evidence", {}).get("verdict")
        except (OSError, ValueError, AttributeError) as error:
            log.warning("cannot read the recommendation %s: %s", self.path, error)
            return None
        if verdict is not None:
            labels["verdict"] = str(verdict)
        return labels


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime, stat.st_size


def _promises(path: Path) -> dict[str, str]:
    """``{"promises": held|not_held|too_few}`` from the check's verdict, ``{}`` without one."""
    try:
        held = json.loads(path.read_text()).get("held", "absent")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError) as error:
        log.warning("cannot read the recommendation's check %s: %s", path, error)
        return {}
    return {"promises": {True: "held", False: "not_held", None: "too_few"}.get(held, "too_few")}


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
