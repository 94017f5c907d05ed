"""The current recommendation as labels for ``kvtier_recommendation_info``.

Reads the ``recommendation.json`` that ``kvtier recommend`` writes, at scrape time, and only
again when the file changes, so a new recommendation shows up without a restart.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


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
        if self._seen != (stat.st_mtime, stat.st_size):
            self._seen = (stat.st_mtime, stat.st_size)
            self._labels = self._read()
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


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
