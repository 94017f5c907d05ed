"""Read a YAML config as ruamel.yaml's round-trip tree, refusing, with
:class:`ConfigFileError`, any file kvtier cannot edit without surprise:

* text that is not YAML, or whose top is not a mapping (``key: value`` lines);
* a key written twice, or two spellings of one key (``kv-transfer-config`` and
  ``kv_transfer_config``: vLLM reads both as one flag, and the later would win);
* a layout the editor would not reproduce line for line (mixed indentation): :func:`load`
  checks that the file survives a read and write unchanged before anything is edited;
* a document nested deeper than :data:`~kvtier.policy.writers.inputs.DEPTH_LIMIT` levels
  (ruamel stops composing there, long before Python's recursion limit), or whose aliases
  expand to more than :data:`~kvtier.policy.writers.inputs.VALUES_LIMIT` values (counted
  node by node without expanding them: a kilobyte alias bomb is refused at once).

Every check is one pass over the tree: a load costs one read and one write of the file.
:mod:`kvtier.policy.writers.yamledit` edits the tree.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

from kvtier.policy.writers.inputs import DEPTH_LIMIT, VALUES_LIMIT

class ConfigFileError(ValueError):
    """The config file cannot be edited safely; the message says where and why."""


def norm_key(key) -> str:
    return str(key).replace("_", "-")


def _yaml(text: str):
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.max_depth = DEPTH_LIMIT + 1  # ruamel counts the scalars inside the deepest collection
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


def dump(yaml, data) -> str:
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def load(text: str):
    """The document as ruamel's commented mapping; :class:`ConfigFileError` if it is not a
    mapping kvtier can edit."""
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.composer import MaxDepthExceededError
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import YAMLError

    yaml = _yaml(text)
    try:
        data = yaml.load(text)
    except MaxDepthExceededError as error:
        raise ConfigFileError(f"{_where(error)}: nested more than {DEPTH_LIMIT} levels deep; an "
                              "engine config is a few levels deep") from None
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
    _refuse_alias_bombs(data)
    _refuse_two_spellings(data)
    if text.strip() and dump(yaml, data) != (text if text.endswith("\n") else text + "\n"):
        line = _first_difference(text, dump(yaml, data))
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


def _refuse_alias_bombs(data) -> None:
    """Count the values the document spells out with its aliases expanded, each node once."""
    expanded: dict[int, int] = {}
    for node in _bottom_up(data):
        expanded[id(node)] = 1 + sum(expanded.get(id(child), 1) for child in _children(node))
    if expanded.get(id(data), 0) > VALUES_LIMIT:
        raise ConfigFileError(f"its aliases (*name) expand to more than {VALUES_LIMIT} values; "
                              "an engine config spells out a few dozen: write them out")


def _bottom_up(data) -> list:
    """Every distinct mapping and list in ``data``, each after the ones inside it."""
    order, seen, stack = [], set(), [(data, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
        elif isinstance(node, (Mapping, list, tuple)) and id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))
    return order


def _children(node) -> list:
    """A mapping's keys and values (a key can be a list: ``? [a, b]``), a list's items."""
    return [*node.keys(), *node.values()] if isinstance(node, Mapping) else list(node)


def _refuse_two_spellings(node, at: str = "", seen: set | None = None) -> None:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    seen = set() if seen is None else seen
    if isinstance(node, (CommentedMap, CommentedSeq)):
        if id(node) in seen:  # an alias: checked where its anchor is
            return
        seen.add(id(node))
    if isinstance(node, CommentedMap):
        spelled: dict[str, object] = {}
        for key in node:
            other = spelled.get(norm_key(key))
            if other is not None:
                raise ConfigFileError(
                    f"{at}{other} (line {line_of(node, other)}) and {key} (line {line_of(node, key)}) "
                    "are two spellings of one key (an engine reads them as one, the last "
                    "winning); keep one and push again")
            spelled[norm_key(key)] = key
            _refuse_two_spellings(node[key], f"{at}{key}.", seen)
    elif isinstance(node, CommentedSeq):
        for item in node:
            _refuse_two_spellings(item, at, seen)


def line_of(mapping, key) -> int:
    try:
        return mapping.lc.key(key)[0] + 1
    except (AttributeError, KeyError, TypeError):
        return 0
