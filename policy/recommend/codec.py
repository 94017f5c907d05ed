"""JSON for the recommendation's frozen dataclasses: :func:`encode` and :func:`decode`.

:func:`encode` turns a value into JSON-ready data; :func:`decode` reads it back as a given
type, checking each field's type and naming the path of a bad one (``ValueError``). Fields
that hold a mapping are tuples of pairs whose JSON form is an object (:func:`pairs`); a field
may be written under another key (:func:`keyed`); a ``None`` in a field whose default is
``None`` is left out of the JSON and comes back as that default. Standard library only.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import field

AS_OBJECT = {"json": "object"}


def pairs(**kwargs) -> dataclasses.Field:
    """A field holding ``((key, value), ...)`` whose JSON form is an object."""
    return field(default=(), metadata=AS_OBJECT, **kwargs)


def keyed(key: str, **kwargs) -> dataclasses.Field:
    """A field written under another JSON key (kept for readers of earlier files)."""
    return field(metadata={"key": key}, **kwargs)


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def encode(value):
    """JSON-ready data of a value (dataclasses, tuples, scalars), ``None`` fields left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None and f.default is None:  # absent: decode restores the default
                continue
            if f.metadata.get("json") == "object":
                out[_key(f)] = {str(k): encode(v) for k, v in item}
            else:
                out[_key(f)] = encode(item)
        return out
    if isinstance(value, (tuple, list)):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    return value


def decode(kind, data, where: str = "value"):
    """``data`` (as :func:`encode` wrote it) as a ``kind``; ``ValueError`` naming ``where``."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if data is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return decode(inner, data, where)
    if dataclasses.is_dataclass(kind):
        return _decode_dataclass(kind, data, where)
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"{where}: expected a list, got {data!r}")
        args = typing.get_args(kind)
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        if item is None:  # a fixed-length tuple, e.g. (str, int)
            if len(data) != len(args):
                raise ValueError(f"{where}: expected {len(args)} items, got {data!r}")
            return tuple(decode(a, d, f"{where}[{i}]") for i, (a, d) in enumerate(zip(args, data)))
        return tuple(decode(item, d, f"{where}[{i}]") for i, d in enumerate(data))
    return _scalar(kind, data, where)


def _decode_dataclass(kind, data, where: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {data!r}")
    hints = typing.get_type_hints(kind)
    known = {_key(f) for f in dataclasses.fields(kind)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values = {}
    for f in dataclasses.fields(kind):
        if _key(f) not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}: missing {_key(f)!r}")
            continue
        item, hint = data[_key(f)], hints[f.name]
        if f.metadata.get("json") == "object":
            if not isinstance(item, dict):
                raise ValueError(f"{where}.{f.name}: expected an object, got {item!r}")
            (pair,) = typing.get_args(hint)[:1]
            value_kind = typing.get_args(pair)[1]
            values[f.name] = tuple((k, decode(value_kind, v, f"{where}.{f.name}.{k}"))
                                   for k, v in item.items())
        else:
            values[f.name] = decode(hint, item, f"{where}.{f.name}")
    try:
        return kind(**values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


def _scalar(kind, data, where: str):
    if kind is object or kind is typing.Any:
        return _frozen(data)
    if kind is float and isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    if kind in (int, str, bool) and isinstance(data, kind) and (kind is bool or not isinstance(data, bool)):
        return data
    if kind is type(None) and data is None:
        return None
    raise ValueError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {data!r}")


def _frozen(data):
    """JSON lists as tuples, so a decoded value is as immutable as an encoded one."""
    if isinstance(data, list):
        return tuple(_frozen(item) for item in data)
    return data
