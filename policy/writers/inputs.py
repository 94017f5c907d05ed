"""Everything a push reads, bounded: what kind of file, how large, how deeply nested.

A push reads two files it is given, the recommendation and the engine's config, and must
end in seconds with a one-line answer whatever they hold:

* only a regular file is read: it is opened with ``O_NONBLOCK`` and checked with ``fstat``
  before a byte is read, so a FIFO (or a file swapped for one after a ``stat``) never
  blocks a push, and a device or socket is named and refused;
* at most :data:`CONFIG_LIMIT_BYTES` of a config (a serve config is a few KB) and
  :data:`RECOMMENDATION_LIMIT_BYTES` of a recommendation (kvtier recommend writes tens of
  KB) are read; a larger file is refused by its size, before it is parsed;
* a document nested deeper than :data:`DEPTH_LIMIT` levels is refused (JSON here, YAML in
  :mod:`kvtier.policy.writers.yamledit`): Python's own readers stop with a
  ``RecursionError`` near a thousand, and every walk over the value after them recurses;
* YAML aliases may expand to at most :data:`VALUES_LIMIT` values (a kilobyte of nested
  aliases names billions; ``yamledit`` counts them without expanding).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

CONFIG_LIMIT_BYTES = 1 << 20
RECOMMENDATION_LIMIT_BYTES = 16 << 20
DEPTH_LIMIT = 64
VALUES_LIMIT = 1 << 20  # as many values as the largest config push reads could spell out
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class NotReadable(ValueError):
    """The input is not one a push reads (its kind, size or depth); the message says why."""


def kind_of(mode: int) -> str | None:
    """What a ``st_mode`` names when it is not a regular file (``"a FIFO (named pipe)"``),
    ``None`` for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def read_regular(path: str | Path, what: str, limit_bytes: int, advice: str) -> bytes:
    """The bytes of the regular file ``path``; :class:`NotReadable` for another kind of file
    or one over ``limit_bytes``, ``OSError`` if it cannot be opened or read. ``what`` names
    the file in messages (``"--config serve.yaml"``), ``advice`` says what to give instead."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        kind = kind_of(info.st_mode)
        if kind is not None:
            raise NotReadable(f"{what} is {kind}; {advice}")
        if info.st_size > limit_bytes:
            raise NotReadable(too_large(what, info.st_size, limit_bytes, advice))
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit_bytes:  # it grew after the fstat
                raise NotReadable(too_large(what, size, limit_bytes, advice))
        return b"".join(chunks)
    finally:
        os.close(fd)


def too_large(what: str, size_bytes: int, limit_bytes: int, advice: str) -> str:
    return f"{what} is {_mib(size_bytes)}, over the {_mib(limit_bytes)} kvtier push reads; {advice}"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def load_json(text: str | bytes, what: str):
    """``json.loads(text)``: :class:`NotReadable` naming ``what`` if it nests deeper than
    :data:`DEPTH_LIMIT`, ``ValueError`` for bad syntax (``json.JSONDecodeError``) or bytes
    that are not UTF-8."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise NotReadable(nested_too_deep(what)) from None
    if depth_over(value, DEPTH_LIMIT):
        raise NotReadable(nested_too_deep(what))
    return value


def nested_too_deep(what: str) -> str:
    return (f"{what} is nested more than {DEPTH_LIMIT} levels deep; an engine config or a "
            "recommendation is a few levels deep: give the file kvtier wrote or the engine reads")


def depth_over(value, limit: int) -> bool:
    """Whether ``value`` (lists and dicts) nests more than ``limit`` levels (no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in
                         (node.values() if isinstance(node, dict) else node))
    return False
