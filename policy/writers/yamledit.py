"""Edit a YAML config file in place: comments, key order, quoting and layout kept.

ruamel.yaml's round-trip mode reads the file into ordered mappings that remember their
comments; kvtier sets the keys it owns and writes the rest back as it was. It refuses, with
:class:`ConfigFileError`, any file it cannot edit without surprise:

* text that is not YAML, or whose top is not a mapping (``key: value`` lines);
* a key written twice, or two spellings of one key (``kv-transfer-config`` and
  ``kv_transfer_config``: vLLM reads both as one flag, and the later would win);
* a layout the editor would not reproduce line for line (mixed indentation): it checks
  that the file survives a read and write unchanged before it edits anything.

``spellings=True`` (vLLM) finds a key whatever its separator and keeps the file's spelling.
Otherwise names are exact, and a key the file spells with the other separator is refused:
the engine would read the two as different keys.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

__all__ = ["ConfigFileError", "yaml_get", "yaml_set"]


class ConfigFileError(ValueError):
    """The config file cannot be edited safely; the message says where and why."""


def _norm(key) -> str:
    return str(key).replace("_", "-")


def _yaml(text: str):
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 1 << 16  # never fold long values (JSON strings) onto a second line
    mapping, sequence, offset = _indents(text)
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    yaml.representer.add_representer(
        type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    return yaml


def _indents(text: str) -> tuple[int, int, int]:
    """The file's mapping indent, and its sequences' item and dash indents (ruamel's terms)."""
    lines = [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    mapping, sequence, offset = None, None, None
    for parent, child in zip(lines, lines[1:]):
        if not parent.rstrip().endswith(":"):
            continue
        step = _indent_of(child) - _indent_of(parent)
        if step <= 0 and not child.lstrip().startswith("- "):
            continue
        if child.lstrip().startswith("- "):
            if offset is None:
                offset = max(step, 0)
                after = child.lstrip()[2:]
                sequence = offset + 2 + (len(after) - len(after.lstrip()))
        elif mapping is None:
            mapping = step
    return mapping or 2, sequence or (offset or 0) + 2, offset or 0


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _dump(yaml, data) -> str:
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def _load(text: str):
    """The document as ruamel's commented mapping; :class:`ConfigFileError` if it is not a
    mapping kvtier can edit."""
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import YAMLError

    yaml = _yaml(text)
    try:
        data = yaml.load(text)
    except DuplicateKeyError as error:
        raise ConfigFileError(f"{_where(error)}: a key is written twice ({_problem(error)}); "
                              "keep one and push again") from None
    except YAMLError as error:
        raise ConfigFileError(f"not valid YAML ({_where(error)}: {_problem(error)}); fix the "
                              "file first: kvtier edits only files it can parse") from None
    if data is None:
        return yaml, CommentedMap()
    if not isinstance(data, CommentedMap):
        kind = "a list" if isinstance(data, list) else f"a {type(data).__name__} value"
        raise ConfigFileError(f"the top of the file is {kind}; an engine config is a mapping "
                              "(key: value lines)")
    _refuse_two_spellings(data)
    if text.strip() and _dump(yaml, data) != (text if text.endswith("\n") else text + "\n"):
        line = _first_difference(text, _dump(yaml, data))
        raise ConfigFileError(f"kvtier's YAML editor would rewrite line {line} of it (mixed "
                              "indentation?); indent it consistently, or edit it by hand")
    return yaml, data


def _where(error) -> str:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    return f"line {mark.line + 1}" if mark is not None else "somewhere"


def _problem(error) -> str:
    return (getattr(error, "problem", None) or str(error).strip().splitlines()[0]).strip()


def _first_difference(old: str, new: str) -> int:
    for number, (a, b) in enumerate(zip(old.splitlines(), new.splitlines()), start=1):
        if a != b:
            return number
    return min(len(old.splitlines()), len(new.splitlines())) + 1


def _refuse_two_spellings(node, at: str = "") -> None:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, CommentedMap):
        seen: dict[str, object] = {}
        for key in node:
            other = seen.get(_norm(key))
            if other is not None:
                raise ConfigFileError(
                    f"{at}{other} (line {_line(node, other)}) and {key} (line {_line(node, key)}) "
                    "are two spellings of one key (an engine reads them as one, the last "
                    "winning); keep one and push again")
            seen[_norm(key)] = key
            _refuse_two_spellings(node[key], f"{at}{key}.")
    elif isinstance(node, CommentedSeq):
        for item in node:
            _refuse_two_spellings(item, at)


def _line(mapping, key) -> int:
    try:
        return mapping.lc.key(key)[0] + 1
    except (AttributeError, KeyError, TypeError):
        return 0


def _find(mapping, key: str, spellings: bool):
    """The key as the file spells it, or ``None``; refuses the other spelling when exact."""
    if key in mapping:
        return key
    for existing in mapping:
        if _norm(existing) == _norm(key):
            if spellings:
                return existing
            raise ConfigFileError(f"line {_line(mapping, existing)} spells {existing}, but the "
                                  f"engine reads {key}: rename it (kvtier writes one spelling only)")
    return None


def yaml_get(text: str, path: tuple[str, ...], *, spellings: bool = False):
    """The value at ``path`` (plain Python: mappings as dicts), or ``None`` if absent."""
    _, node = _load(text)
    for key in path:
        if not isinstance(node, Mapping):
            return None
        found = _find(node, key, spellings)
        if found is None:
            return None
        node = node[found]
    return _plain(node)


def _plain(node):
    if isinstance(node, Mapping):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def yaml_set(text: str, updates: Mapping[tuple[str, ...], object], *, spellings: bool = False) -> str:
    """``text`` with each ``path -> value`` set: an existing key keeps its place, spelling and
    comment; a missing one is added at the end of its mapping. A mapping value updates a
    mapping in the file key by key (its comments stay) and drops the keys it lacks."""
    yaml, data = _load(text)
    for path, value in updates.items():
        node = data
        for depth, key in enumerate(path[:-1]):
            found = _find(node, key, spellings)
            if found is None:  # the rest of the path is new: add it whole
                for inner in reversed(path[depth + 1:]):
                    value = {inner: value}
                _append(node, key, _fresh(value))
                break
            if not isinstance(node[found], Mapping):
                raise ConfigFileError(f"{'.'.join(path[:depth + 1])} (line {_line(node, found)}) "
                                      "is a value; kvtier needs a mapping of keys there")
            node = node[found]
        else:
            _set(node, path[-1], value, spellings)
    return _dump(yaml, data)


def _set(mapping, key: str, value, spellings: bool) -> None:
    found = _find(mapping, key, spellings)
    if found is None:
        _append(mapping, key, _fresh(value))
    elif isinstance(value, Mapping) and isinstance(mapping[found], Mapping):
        _sync(mapping[found], value, spellings)
    else:
        mapping[found] = _fresh(value)


def _sync(mapping, value: Mapping, spellings: bool) -> None:
    for key in [k for k in mapping if not any(_norm(k) == _norm(n) for n in value)]:
        del mapping[key]
    for key, item in value.items():
        _set(mapping, key, item, spellings)


def _fresh(value):
    """A new value as block YAML (a plain dict would be fine too; lists stay flow-free)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(value, Mapping):
        out = CommentedMap()
        for k, v in value.items():
            out[k] = _fresh(v)
        return out
    if isinstance(value, (list, tuple)):
        return CommentedSeq(_fresh(v) for v in value)
    return value


def _append(mapping, key: str, value) -> None:
    """Add ``key`` last. Blank lines and comments after the old last key belong after the
    block, so they move below the new key (ruamel keeps them on the old one)."""
    last = next(reversed(mapping), None) if len(mapping) else None
    mapping[key] = value
    if last is None:
        return
    tokens = mapping.ca.items.get(last)
    if not tokens or len(tokens) < 3 or tokens[2] is None or "\n" not in tokens[2].value:
        return
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    head, _, tail = tokens[2].value.partition("\n")
    if not tail:
        return
    tokens[2].value = head + "\n"
    holder, holder_key = mapping, key
    while isinstance(holder[holder_key], Mapping) and len(holder[holder_key]):
        holder = holder[holder_key]  # a new block: the lines go after its last key
        holder_key = next(reversed(holder))
    holder.ca.items[holder_key] = [None, None, CommentToken("\n" + tail, CommentMark(0), None), None]
