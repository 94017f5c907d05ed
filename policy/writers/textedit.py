"""Line editors that change a few keys in a config file and keep everything else as written
(comments, order, other keys), so the diff a push shows is only what kvtier changed.

* YAML: top-level ``key: value`` and one level of block mapping (``parent:`` then indented
  ``child: value``), which is all the engine configs kvtier writes need. Anything it cannot
  edit safely (a flow mapping ``parent: {..}``, a scalar where a mapping is needed) raises
  ``ValueError`` rather than guessing.
* env files: ``KEY=value`` / ``export KEY=value``.
* argument files: one ``--flag value`` (or ``--flag=value``, or a bare ``--flag``) per line.
"""

from __future__ import annotations

import json
import re
from typing import Mapping

_KEY = re.compile(r"^(?P<indent>[ ]*)(?P<key>[A-Za-z0-9_.-]+)[ ]*:(?P<rest>.*)$")
_PLAIN = re.compile(r"^[A-Za-z0-9_./+-][A-Za-z0-9_./+@: -]*$")
_RESERVED = {"true", "false", "null", "yes", "no", "on", "off", "~", ""}


def yaml_scalar(value) -> str:
    """A Python scalar as YAML text (strings quoted when YAML could read them otherwise)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if (_PLAIN.match(text) and text.lower() not in _RESERVED and not _is_number(text)
            and ": " not in text and not text.endswith(":")):
        return text
    if '"' in text and "'" not in text:
        return "'" + text + "'"
    return json.dumps(text)


def parse_yaml_scalar(text: str):
    """The value of a YAML scalar as written by a person or by :func:`yaml_scalar`."""
    text = _strip_comment(text).strip()
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.startswith('"'):
        return json.loads(text)
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        return text[1:-1].replace("''", "'")
    if text.startswith(("{", "[", "|", ">", "&", "*", "!")):
        raise ValueError(f"unsupported YAML value {text[:30]!r} (flow, block or tagged)")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _strip_comment(text: str) -> str:
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i]
    return text


def _comment_of(rest: str) -> str:
    stripped = _strip_comment(rest)
    return rest[len(stripped):].strip()


def _entries(lines: list[str], indent: int, start: int, stop: int) -> dict[str, int]:
    found = {}
    for i in range(start, stop):
        m = _KEY.match(lines[i])
        if m and len(m["indent"]) == indent:
            found[m["key"]] = i
    return found


def _block_end(lines: list[str], start: int) -> int:
    """Index after the last line that belongs to the block opened at ``start``."""
    end = start + 1
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line.startswith((" ", "\t", "#")):
            break
        if line.strip() and not line.lstrip().startswith("#"):
            end = i + 1
    return end


def _set_line(lines: list[str], index: int, indent: str, key: str, value) -> None:
    comment = _comment_of(_KEY.match(lines[index])["rest"])
    lines[index] = f"{indent}{key}: {yaml_scalar(value)}" + (f"  {comment}" if comment else "")


def yaml_get(text: str, path: tuple[str, ...]):
    """The scalar at ``path`` (one or two keys), or ``None`` if it is absent."""
    lines = text.splitlines()
    top = _entries(lines, 0, 0, len(lines))
    if path[0] not in top:
        return None
    index = top[path[0]]
    if len(path) == 1:
        return parse_yaml_scalar(_KEY.match(lines[index])["rest"])
    inner = _entries(lines, _child_indent(lines, index), index + 1, _block_end(lines, index))
    if path[1] not in inner:
        return None
    return parse_yaml_scalar(_KEY.match(lines[inner[path[1]]])["rest"])


def _child_indent(lines: list[str], parent: int) -> int:
    for line in lines[parent + 1:_block_end(lines, parent)]:
        if line.strip() and not line.lstrip().startswith("#"):
            return len(line) - len(line.lstrip(" "))
    return 2


def yaml_set(text: str, updates: Mapping[tuple[str, ...], object]) -> str:
    """``text`` with each ``path -> value`` set (added where missing); other lines kept."""
    lines = text.splitlines()
    for path, value in updates.items():
        if len(path) == 1:
            _set_top(lines, path[0], value)
        elif len(path) == 2:
            _set_nested(lines, path[0], path[1], value)
        else:
            raise ValueError(f"YAML paths are one or two keys deep, got {'.'.join(path)}")
    return "\n".join(lines) + "\n"


def _set_top(lines: list[str], key: str, value) -> None:
    top = _entries(lines, 0, 0, len(lines))
    if key not in top:
        lines.append(f"{key}: {yaml_scalar(value)}")
        return
    index = top[key]
    if not _strip_comment(_KEY.match(lines[index])["rest"]).strip() and \
            _block_end(lines, index) > index + 1:
        raise ValueError(f"{key} is a mapping in the file; refusing to replace it with a value")
    _set_line(lines, index, "", key, value)


def _set_nested(lines: list[str], parent: str, key: str, value) -> None:
    top = _entries(lines, 0, 0, len(lines))
    if parent not in top:
        lines.extend([f"{parent}:", f"  {key}: {yaml_scalar(value)}"])
        return
    index = top[parent]
    if _strip_comment(_KEY.match(lines[index])["rest"]).strip():
        raise ValueError(f"{parent} is written inline (flow style); kvtier edits only block "
                         f"mappings — rewrite it as '{parent}:' with indented keys")
    end = _block_end(lines, index)
    indent = _child_indent(lines, index)
    inner = _entries(lines, indent, index + 1, end)
    if key in inner:
        _set_line(lines, inner[key], " " * indent, key, value)
    else:
        lines.insert(end, f"{' ' * indent}{key}: {yaml_scalar(value)}")


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


def args_get(text: str, flag: str) -> str | bool | None:
    for line in text.splitlines():
        if _flag_of(line) == flag:
            rest = line.strip()[len(flag):].lstrip(" =")
            return rest if rest else True
    return None
