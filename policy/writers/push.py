"""Apply settings to an engine config file as one transaction: merge, diff, guardrails,
backup, atomic write.

:func:`load_recommendation` picks the settings written for the engine being pushed: a
per-engine file (``recommendation.vllm.json``) must be that engine's, and the neutral
``recommendation.json`` carries every engine's settings in its evidence; a document of
another kind or version than kvtier writes is refused. :func:`plan` computes everything
without touching the disk (what ``--dry-run`` shows), refusing a file it cannot parse
(:mod:`kvtier.policy.writers.configfile` says which file is edited and how it is read).

:func:`apply` is the transaction. It takes a lock on a sidecar file next to the config
(``.NAME.kvtier-lock``, ``flock``, never waited for: a second push stops with
:class:`PushBusy`), checks the file still holds what the plan read (else
:class:`PushStale`: another writer got there first), writes the new text to a temporary
file in the same directory, then a backup of the old file whose name no other push can
take (UTC time to the microsecond, the next microsecond while that name exists, created
with ``O_EXCL``),
then ``os.replace`` (a reader sees the old file or the new one, never half of either). The
old file is in the backup before the config is replaced, so it can always be recovered; if
any step fails, the temporary file and the backup are removed again. Mode bits of an
existing file are kept, and its owner and group as far as the user may give them; a file
the user may not write is refused by :func:`plan` (a rename in a writable folder would
replace it all the same); a link stays a link to the file it names.
"""

from __future__ import annotations

import dataclasses
import difflib
import fcntl
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterator

from kvtier.policy.recommend.recommendation import KIND, VERSION
from kvtier.policy.writers import writer
from kvtier.policy.writers.configfile import NotWritable, check_writable, keep_owner, read_config
from kvtier.policy.writers.inputs import (RECOMMENDATION_LIMIT_BYTES, NotReadable, load_json,
                                          read_regular)
from kvtier.policy.writers.settings import EngineSettings, Guardrails


class PushRefused(ValueError):
    """The recommendation or the file breaks a guardrail; the message says which and why."""


class PushBusy(PushRefused):
    """Another push holds the config file's lock; nothing was written."""


class PushStale(PushRefused):
    """The config file changed after the plan read it; nothing was written."""


@dataclass(frozen=True)
class PushPlan:
    """What a push would do to ``path``: old and new text (as on disk: byte-order mark and
    line ends kept), their diff, and notes. ``target`` is the file written: ``path``, or the
    file a link at ``path`` names."""

    engine: str
    path: Path
    old_text: str | None
    new_text: str
    diff: str
    notes: tuple[str, ...]
    target: Path | None = None

    @property
    def written(self) -> Path:
        return self.target or self.path

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
    advice = "give the recommendation.json kvtier recommend wrote"
    try:
        raw = read_regular(path, f"recommendation {path}", RECOMMENDATION_LIMIT_BYTES, advice)
    except NotReadable as exc:
        raise PushRefused(str(exc)) from None
    except OSError as exc:
        raise PushRefused(f"cannot read recommendation {path}: {exc.strerror}") from None
    try:
        data = load_json(raw, f"recommendation {path}")
    except NotReadable as exc:  # nested too deep
        raise PushRefused(str(exc)) from None
    except ValueError as exc:  # bad syntax, or not UTF-8
        raise PushRefused(f"recommendation {path} is not JSON ({exc}); {advice}") from None
    if not isinstance(data, dict):
        raise PushRefused(f"recommendation {path} must be a JSON object, as kvtier recommend writes")
    source = f"{path}"
    _check_kind(data, path)
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


def _check_kind(data: dict, path) -> None:
    """A document that says what it is must be the recommendation this kvtier writes."""
    if "kind" not in data and "version" not in data:
        return  # a hand-written settings file
    kind, version = data.get("kind"), data.get("version")
    if kind != KIND:
        raise PushRefused(f"{path} is a {kind!r} document, not a {KIND!r}; give the "
                          "recommendation.json kvtier recommend wrote")
    if version != VERSION:
        raise PushRefused(f"{path} is a version {version!r} recommendation; this kvtier "
                          f"reads version {VERSION}: re-run kvtier recommend")


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
         path: str | Path, *, force: bool = False) -> PushPlan:
    """Render and diff without writing; :class:`PushRefused` if a guardrail is broken or the
    file cannot be parsed or edited safely. ``force`` lets a writer replace what another
    product owns in the file (vLLM: a connector that is not an offloading one)."""
    from kvtier.policy.writers.yamledit import ConfigFileError

    path = Path(path)
    problems = guardrails.violations(settings)
    if problems:
        raise PushRefused("; ".join(problems))
    try:
        module = writer(engine)
        config = read_config(path)
        rendered = module.render(settings, config.text, path.suffix.lower(), force=force)
    except ConfigFileError as exc:
        raise PushRefused(f"{path}: {exc}") from None
    except UnicodeDecodeError:
        raise PushRefused(f"{path} is not a text file (not UTF-8); give the engine's config file") from None
    except (ValueError, KeyError) as exc:  # NotReadable, a writer's refusal
        raise PushRefused(str(exc)) from None
    except OSError as exc:
        raise PushRefused(f"cannot read {path}: {exc.strerror}") from None
    new_text = rendered.text
    diff = "".join(difflib.unified_diff(  # of the text as the writers see it: no line-end noise
        (config.text or "").splitlines(keepends=True), new_text.splitlines(keepends=True),
        fromfile=str(path) if config.text is not None else "/dev/null", tofile=str(path)))
    notes = rendered.notes
    if config.is_link:
        notes = (f"{path} is a link: kvtier edits the file it names, {config.target}, and "
                 "keeps the link",) + notes
    old = None if config.text is None else config.as_written(config.text)
    if old is not None and new_text != config.text:
        try:
            notes += check_writable(path, config.target)
        except NotWritable as exc:
            raise PushRefused(str(exc)) from None
        except OSError as exc:
            raise PushRefused(f"cannot read {path}: {exc.strerror}") from None
    return PushPlan(engine, path, old, config.as_written(new_text), diff, notes, config.target)


def apply(push: PushPlan, *, clock: Callable[[], float] = time.time) -> Path | None:
    """Write the plan as one transaction (see the module); returns the backup path (``None``
    if the file is new or unchanged). :class:`PushBusy` or :class:`PushStale` if another
    writer is or was at the file; on ``OSError`` nothing is left behind: the file is as it
    was, no backup."""
    if not push.changed:
        return None
    target = push.written
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target):
        _check_unchanged(push, target)
        return _replace(push, target, clock)


@contextmanager
def _locked(target: Path) -> Iterator[None]:
    lock_path = target.with_name(f".{target.name}.kvtier-lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PushBusy(f"another kvtier push is writing {target} (it holds {lock_path}); "
                           "nothing written: push again when it is done") from None
        yield  # the lock file stays: removing it would let a third push lock a new one
    finally:
        os.close(fd)


def _check_unchanged(push: PushPlan, target: Path) -> None:
    try:
        now = read_config(target)
    except (NotReadable, UnicodeDecodeError):
        now = None
    current = None if now is None or now.text is None else now.as_written(now.text)
    if now is None or current != push.old_text:
        raise PushStale(f"{target} changed after kvtier read it (another push or an editor); "
                        "nothing written: run kvtier push again to see the new diff")


def _replace(push: PushPlan, target: Path, clock: Callable[[], float]) -> Path | None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    backup = None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(push.new_text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        if push.old_text is not None:
            keep_owner(target, tmp)  # first: a chown clears the set-id bits copymode sets
            shutil.copymode(target, tmp)
            backup = _backup(target, clock)
        os.replace(tmp, target)
    except BaseException:
        for leftover in (tmp, backup):
            if leftover is not None and os.path.exists(leftover):
                os.unlink(leftover)
        raise
    return backup


def _backup(target: Path, clock: Callable[[], float]) -> Path:
    """Copy ``target`` to a backup no other push can be writing: ``O_EXCL`` on a name with
    the UTC time to the microsecond, one microsecond later while that name exists (so the
    names still sort in the order the backups were made)."""
    start = datetime.fromtimestamp(clock(), timezone.utc)
    for step in range(1000):
        stamp = (start + timedelta(microseconds=step)).strftime("%Y%m%dT%H%M%S.%fZ")
        backup = target.with_name(f"{target.name}.kvtier-{stamp}.bak")
        try:
            fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as out, open(target, "rb") as source:
                shutil.copyfileobj(source, out)
                out.flush()
                os.fsync(out.fileno())
            shutil.copystat(target, backup)
        except BaseException:
            os.unlink(backup)
            raise
        return backup
    raise FileExistsError(f"1000 backups of {target} from {start:%Y%m%dT%H%M%S.%fZ} on; "
                          "remove some")
