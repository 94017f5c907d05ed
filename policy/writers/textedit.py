"""Line editors that change a few keys in a config file and keep everything else as written
(comments, order, other keys), so the diff a push shows is only what kvtier changed. YAML
files are edited by :mod:`kvtier.policy.writers.yamledit`.

* env files: ``KEY=value`` / ``export KEY=value``.
* argument files: one ``--flag value`` (or ``--flag=value``, or a bare ``--flag``) per line.
"""

from __future__ import annotations

import re
from typing import Mapping

# ---------------------------------------------------------------------- env and args files

_ENV = re.compile(r"^(?P<export>export\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")


def env_set(text: str, updates: Mapping[str, object]) -> str:
    """``KEY=value`` lines set or appended; values are written bare (numbers, paths)."""
    lines = text.splitlines()
    for key, value in updates.items():
        rendered = f"{key}={_env_value(value)}"
        for i, line in enumerate(lines):
            m = _ENV.match(line.strip())
            if m and m["key"] == key:
                lines[i] = (m["export"] or "") + rendered
                break
        else:
            lines.append(rendered)
    return "\n".join(lines) + "\n"


def _env_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./:@+-]*", text):
        return text
    raise ValueError(f"env value {text!r} needs quoting; kvtier writes only plain values")


def env_get(text: str, key: str) -> str | None:
    for line in text.splitlines():
        m = _ENV.match(line.strip())
        if m and m["key"] == key:
            return m["value"]
    return None


def args_set(text: str, updates: Mapping[str, object]) -> str:
    """``--flag value`` lines: set, append, or (``False``) remove a boolean flag."""
    lines = text.splitlines()
    for flag, value in updates.items():
        index = next((i for i, line in enumerate(lines) if _flag_of(line) == flag), None)
        if value is False:
            if index is not None:
                del lines[index]
            continue
        rendered = flag if value is True else f"{flag} {_arg_value(value)}"
        if index is None:
            lines.append(rendered)
        else:
            lines[index] = rendered
    return "\n".join(lines) + "\n"


def _flag_of(line: str) -> str | None:
    stripped = line.strip()
    if not stripped.startswith("--"):
        return None
    return re.split(r"[ =]", stripped, maxsplit=1)[0]


def _arg_value(value) -> str:
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./:@+-]+", text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"
