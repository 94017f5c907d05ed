"""Apply settings to an engine config file: merge, diff, guardrails, backup, atomic write.

:func:`plan` computes everything without touching the disk (what ``--dry-run`` shows);
:func:`apply` writes: a backup of the old file next to it, then the new text through a
temporary file in the same directory and ``os.replace`` (a reader sees the old file or the
new one, never half of either). Mode bits of an existing file are kept.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from policy.writers import writer
from policy.writers.settings import EngineSettings, Guardrails


class PushRefused(ValueError):
    """The recommendation or the file breaks a guardrail; the message says which and why."""


@dataclass(frozen=True)
class PushPlan:
    """What a push would do to ``path``: old and new text, their diff, and notes."""

    engine: str
    path: Path
    old_text: str | None
    new_text: str
    diff: str
    notes: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return self.old_text != self.new_text


def load_recommendation(path: str | Path) -> tuple[EngineSettings, Guardrails]:
    """Read ``{"settings": {...}, "guardrails": {...}}`` (or bare settings) from JSON."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PushRefused(f"cannot read recommendation {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise PushRefused(f"recommendation {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PushRefused(f"recommendation {path} must be a JSON object")
    if "settings" in data:
        unknown = sorted(set(data) - {"settings", "guardrails", "kind", "version", "notes",
                                      "evidence"})
        if unknown:
            raise PushRefused(f"unknown recommendation key(s) {', '.join(unknown)}")
        settings_data, guard_data = data["settings"], data.get("guardrails") or {}
    else:
        settings_data, guard_data = data, {}
    try:
        return EngineSettings.from_mapping(settings_data), Guardrails(**guard_data)
    except TypeError as exc:
        raise PushRefused(f"bad guardrails in {path}: {exc}") from None
    except ValueError as exc:
        raise PushRefused(str(exc)) from None


def plan(settings: EngineSettings, guardrails: Guardrails, engine: str,
         path: str | Path) -> PushPlan:
    """Render and diff without writing; :class:`PushRefused` if a guardrail is broken."""
    path = Path(path)
    problems = guardrails.violations(settings)
    if problems:
        raise PushRefused("; ".join(problems))
    try:
        module = writer(engine)
        old = path.read_text() if path.exists() else None
        rendered = module.render(settings, old, path.suffix.lower())
    except (ValueError, KeyError) as exc:
        raise PushRefused(str(exc)) from None
    except OSError as exc:
        raise PushRefused(f"cannot read {path}: {exc.strerror}") from None
    diff = "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), rendered.text.splitlines(keepends=True),
        fromfile=str(path) if old is not None else "/dev/null", tofile=str(path)))
    return PushPlan(engine, path, old, rendered.text, diff, rendered.notes)


def apply(push: PushPlan, *, clock: Callable[[], float] = time.time) -> Path | None:
    """Write the plan; returns the backup path (``None`` if the file is new or unchanged)."""
    if not push.changed:
        return None
    path = push.path
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if push.old_text is not None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock()))
        backup = path.with_name(f"{path.name}.kvtier-{stamp}.bak")
        shutil.copy2(path, backup)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(push.new_text)
            handle.flush()
            os.fsync(handle.fileno())
        if push.old_text is not None:
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return backup
