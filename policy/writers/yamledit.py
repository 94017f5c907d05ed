"""Edit a YAML config file in place: comments, key order, quoting and layout kept.

ruamel.yaml's round-trip mode reads the file into ordered mappings that remember their
comments (:mod:`kvtier.policy.writers.yamlload` reads it, and refuses, with
:class:`ConfigFileError`, any file kvtier cannot edit without surprise); kvtier sets the keys
it owns and writes the rest back as it was.

:class:`YamlDoc` parses a file once and makes every edit on that one tree: an edit costs one
read and two writes of the file (the round-trip check, the result), time linear in it.

``spellings=True`` (vLLM) finds a key whatever its separator and keeps the file's spelling.
Otherwise names are exact, and a key the file spells with the other separator is refused:
the engine would read the two as different keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvtier.policy.writers.yamlload import ConfigFileError, dump, line_of, load, norm_key

__all__ = ["ConfigFileError", "YamlDoc", "yaml_get", "yaml_set"]


def _find(mapping, key: str, spellings: bool):
    """The key as the file spells it, or ``None``; refuses the other spelling when exact."""
    if key in mapping:
        return key
    for existing in mapping:
        if norm_key(existing) == norm_key(key):
            if spellings:
                return existing
            raise ConfigFileError(f"line {line_of(mapping, existing)} spells {existing}, but the "
                                  f"engine reads {key}: rename it (kvtier writes one spelling only)")
    return None


class YamlDoc:
    """One YAML config, read once (:func:`kvtier.policy.writers.yamlload.load`); :meth:`get`,
    :meth:`delete` and :meth:`set` work on that one tree, :meth:`text` writes it back.
    ``spellings``: see the module."""

    def __init__(self, text: str, *, spellings: bool = False):
        self._text = text
        self._spellings = spellings
        self._yaml, self._data = load(text)

    def get(self, path: tuple[str, ...]):
        """The value at ``path`` (plain Python: mappings as dicts), or ``None`` if absent."""
        node = self._data
        for key in path:
            if not isinstance(node, Mapping):
                return None
            found = _find(node, key, self._spellings)
            if found is None:
                return None
            node = node[found]
        return _plain(node)

    def spelling(self, key: str) -> str | None:
        """The top-level ``key`` as the file spells it, or ``None`` if absent."""
        return _find(self._data, key, self._spellings)

    def delete(self, keys: Iterable[str]) -> tuple[str, ...]:
        """Remove the top-level ``keys`` (one-line values) with their lines; the comments and
        blank lines around them stay. Before any :meth:`set`: the lines are cut from the text
        read. Returns the keys removed, as the file spelled them."""
        found = [k for k in (_find(self._data, key, self._spellings) for key in keys) if k is not None]
        if not found:
            return ()
        if self._data.fa.flow_style():  # {a: 1, b: 2}: no lines of its own to cut
            for key in found:
                del self._data[key]
            return tuple(found)
        cut = set()
        for key in found:
            cut.update(range(self._data.lc.key(key)[0], self._data.lc.value(key)[0] + 1))
        lines = self._text.splitlines(keepends=True)
        text = "".join(line for number, line in enumerate(lines) if number not in cut)
        yaml, data = load(text)
        if list(data) != [k for k in self._data if k not in found]:
            line = min(cut) + 1
            raise ConfigFileError(f"line {line}: kvtier cannot remove {', '.join(found)} alone "
                                  "(a value over several lines?); remove it by hand")
        self._text, self._yaml, self._data = text, yaml, data
        return tuple(found)

    def set(self, updates: Mapping[tuple[str, ...], object]) -> None:
        """Set each ``path -> value``: an existing key keeps its place, spelling and comment;
        a missing one is added at the end of its mapping. A mapping value updates a mapping
        in the file key by key (its comments stay) and drops the keys it lacks."""
        for path, value in updates.items():
            node = self._data
            for depth, key in enumerate(path[:-1]):
                found = _find(node, key, self._spellings)
                if found is None:  # the rest of the path is new: add it whole
                    for inner in reversed(path[depth + 1:]):
                        value = {inner: value}
                    _append(node, key, _fresh(value))
                    break
                if not isinstance(node[found], Mapping):
                    raise ConfigFileError(f"{'.'.join(path[:depth + 1])} (line {line_of(node, found)}) "
                                          "is a value; kvtier needs a mapping of keys there")
                node = node[found]
            else:
                _set(node, path[-1], value, self._spellings)

    def text(self) -> str:
        return dump(self._yaml, self._data)


def yaml_get(text: str, path: tuple[str, ...], *, spellings: bool = False):
    """The value at ``path`` in ``text`` (:meth:`YamlDoc.get`)."""
    return YamlDoc(text, spellings=spellings).get(path)


def yaml_set(text: str, updates: Mapping[tuple[str, ...], object], *, spellings: bool = False) -> str:
    """``text`` with each ``path -> value`` set (:meth:`YamlDoc.set`)."""
    doc = YamlDoc(text, spellings=spellings)
    doc.set(updates)
    return doc.text()


def _plain(node):
    if isinstance(node, Mapping):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _set(mapping, key: str, value, spellings: bool) -> None:
    found = _find(mapping, key, spellings)
    if found is None:
        _append(mapping, key, _fresh(value))
    elif isinstance(value, Mapping) and isinstance(mapping[found], Mapping):
        _sync(mapping[found], value, spellings)
    else:
        mapping[found] = _fresh(value)


def _sync(mapping, value: Mapping, spellings: bool) -> None:
    kept = {norm_key(n) for n in value}  # a set: one look-up a key, not a scan of ``value``
    for key in [k for k in mapping if norm_key(k) not in kept]:
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
