"""Apply settings to an engine config file: merge, diff, guardrails, backup, atomic write.

:func:`load_recommendation` picks the settings written for the engine being pushed: a
per-engine file (``recommendation.vllm.json``) must be that engine's, and the neutral
``recommendation.json`` carries every engine's settings in its evidence. :func:`plan`
computes everything without touching the disk (what ``--dry-run`` shows), refusing a file it
cannot parse. :func:`apply` writes the new text to a temporary file in the same directory,
then a backup of the old file next to it, then ``os.replace`` (a reader sees the old file or
the new one, never half of either); if any step fails, the temporary file and the backup are
removed again. Mode bits of an existing file are kept.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvtier.policy.writers import writer
from kvtier.policy.writers.settings import EngineSettings, Guardrails


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


@dataclass(frozen=True)
class Loaded:
    """The settings to push, the recommendation's guardrails, and where the settings came
    from (shown to the operator)."""

    settings: EngineSettings
    guardrails: Guardrails
    source: str


def load_recommendation(path: str | Path, engine: str | None = None) -> Loaded:
    """Read ``{"settings": {...}, "guardrails": {...}}`` (or bare settings) from JSON; with
    ``engine``, the settings written for it (see the module)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PushRefused(f"cannot read recommendation {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise PushRefused(f"recommendation {path} is not JSON ({exc}); give the "
                          "recommendation.json kvtier recommend wrote") from None
    if not isinstance(data, dict):
        raise PushRefused(f"recommendation {path} must be a JSON object, as kvtier recommend writes")
    source = f"{path}"
    if "settings" in data:
        unknown = sorted(set(data) - {"settings", "guardrails", "kind", "version", "notes",
                                      "evidence", "engine"})
        if unknown:
            raise PushRefused(f"unknown recommendation key(s) {', '.join(unknown)} in {path}")
        settings_data, guard_data = data["settings"], data.get("guardrails") or {}
        settings_data, source = _for_engine(data, settings_data, engine, path)
    else:
        settings_data, guard_data = data, {}
    try:
        return Loaded(EngineSettings.from_mapping(settings_data), Guardrails(**guard_data), source)
    except TypeError:
        known = ", ".join(f.name for f in dataclasses.fields(Guardrails))
        unknown = ", ".join(sorted(set(guard_data) - {f.name for f in dataclasses.fields(Guardrails)}))
        raise PushRefused(f"bad guardrails in {path}: unknown {unknown or 'value'}; known: {known}") from None
    except ValueError as exc:
        raise PushRefused(f"{path}: {exc}") from None


def _for_engine(data: dict, settings: dict, engine: str | None, path) -> tuple[dict, str]:
    written_for = data.get("engine")
    if engine is None:
        return settings, f"{path}"
    if written_for is not None:
        if written_for != engine:
            raise PushRefused(f"{path} holds the {written_for} settings, not {engine}'s; give "
                              f"recommendation.{engine}.json or recommendation.json")
        return settings, f"{path}"
    engines = (data.get("evidence") or {}).get("engines")
    if not isinstance(engines, dict):  # a hand-written or older file: its settings as they are
        return settings, f"{path}"
    if engine not in engines:
        raise PushRefused(f"{path} has no {engine} settings (it has {', '.join(engines) or 'none'}); "
                          f"re-run kvtier recommend --engine {engine}")
    return engines[engine], f"the {engine} settings in {path}"


def plan(settings: EngineSettings, guardrails: Guardrails, engine: str,
         path: str | Path) -> PushPlan:
    """Render and diff without writing; :class:`PushRefused` if a guardrail is broken or the
    file cannot be parsed or edited safely."""
    from kvtier.policy.writers.yamledit import ConfigFileError

    path = Path(path)
    problems = guardrails.violations(settings)
    if problems:
        raise PushRefused("; ".join(problems))
    if path.is_dir():
        raise PushRefused(f"--config {path} is a folder; give the engine's config file")
    try:
        module = writer(engine)
        old = path.read_text() if path.exists() else None
        rendered = module.render(settings, old, path.suffix.lower())
    except ConfigFileError as exc:
        raise PushRefused(f"{path}: {exc}") from None
    except UnicodeDecodeError:
        raise PushRefused(f"{path} is not a text file (not UTF-8); give the engine's config file") from None
    except (ValueError, KeyError) as exc:
        raise PushRefused(str(exc)) from None
    except OSError as exc:
        raise PushRefused(f"cannot read {path}: {exc.strerror}") from None
    diff = "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), rendered.text.splitlines(keepends=True),
        fromfile=str(path) if old is not None else "/dev/null", tofile=str(path)))
    return PushPlan(engine, path, old, rendered.text, diff, rendered.notes)


def apply(push: PushPlan, *, clock: Callable[[], float] = time.time) -> Path | None:
    """Write the plan; returns the backup path (``None`` if the file is new or unchanged).
    On failure (``OSError``) nothing is left behind: the file is as it was, no backup."""
    if not push.changed:
        return None
    path = push.path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    backup = None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(push.new_text)
            handle.flush()
            os.fsync(handle.fileno())
        if push.old_text is not None:
            shutil.copymode(path, tmp)
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock()))
            backup = path.with_name(f"{path.name}.kvtier-{stamp}.bak")
            shutil.copy2(path, backup)
        os.replace(tmp, path)
    except BaseException:
        for leftover in (tmp, backup):
            if leftover is not None and os.path.exists(leftover):
                os.unlink(leftover)
        raise
    return backup
