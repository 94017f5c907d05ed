"""What every trace reader shares: the format error, line-level validation, and skip counting.

A reader turns one public trace format into :class:`kvtier.collector.events.RequestRecord` values in
arrival order (the :class:`kvtier.collector.events.TraceReader` protocol). Bad input never escapes as a
traceback: each problem raises :class:`TraceFormatError` naming the file and line, or, when the
reader was built with ``skip_bad=True``, the line is skipped and counted in ``skipped``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from kvtier.collector.events import UINT64_MAX


class TraceFormatError(ValueError):
    """A trace line or file that breaks its format. The message starts with ``path:line:``."""

    def __init__(self, path: str | Path, line: int | None, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.line = line
        self.problem = problem


class BadLine(Exception):
    """Raised by a per-line parser; the reader adds the file and line and decides to skip."""


def open_text(path: Path) -> IO[str]:
    """Open a plain or gzip-compressed text file."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def json_loads(text: str | bytes):
    """Parse JSON with orjson when installed (several times faster on large traces), else
    the standard library. Raises ``BadLine`` naming the problem."""
    try:
        return _loads(text)
    except json.JSONDecodeError as error:
        raise BadLine(f"invalid JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    except ValueError as error:  # orjson.JSONDecodeError is a ValueError subclass
        raise BadLine(f"invalid JSON ({error})") from None


try:
    from orjson import loads as _loads
except ImportError:  # optional speed-up
    _loads = json.loads


def iter_json_lines(path: Path) -> Iterator[tuple[int, dict | BadLine]]:
    """Yield ``(line_number, object)`` for each non-blank line; a bad line yields a BadLine.
    A file that cannot be read on (truncated gzip, not text) raises ``TraceFormatError``."""
    number = 0
    try:
        with open_text(path) as handle:
            for number, text in enumerate(handle, start=1):
                yield from _parse_line(number, text)
    except (EOFError, OSError, UnicodeDecodeError) as error:
        raise TraceFormatError(path, number + 1, f"unreadable ({error})") from None


def _parse_line(number: int, text: str) -> Iterator[tuple[int, dict | BadLine]]:
    """Nothing for a blank line, else ``(number, object)`` or ``(number, BadLine)``."""
    if not text.strip():
        return
    try:
        value = json_loads(text)
    except BadLine as problem:
        yield number, problem
        return
    if not isinstance(value, dict):
        yield number, BadLine(f"expected a JSON object, got {type(value).__name__}")
        return
    yield number, value


def check_fields(obj: dict, required: frozenset[str], optional: frozenset[str] = frozenset()) -> None:
    """Missing or unknown fields are errors: a renamed field must not be silently ignored."""
    missing = sorted(required - obj.keys())
    if missing:
        raise BadLine(f"missing field(s) {', '.join(missing)}")
    unknown = sorted(obj.keys() - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise BadLine(f"unknown field(s) {', '.join(unknown)}; allowed: {allowed}")


def non_negative_int(obj: dict, name: str) -> int:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadLine(f"{name} must be a non-negative integer, got {value!r}")
    return value


def non_negative_number(obj: dict, name: str) -> float:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise BadLine(f"{name} must be a non-negative number, got {value!r}")
    if math.isinf(value):
        raise BadLine(f"{name} must be finite, got {value!r}")
    return float(value)


def hash_array(obj: dict, name: str, expected_len: int, rule: str) -> np.ndarray:
    """The block id list as a uint64 array, checked for type, range and length.

    The common case (a list of small non-negative ints) is checked in C by numpy; anything
    else takes the exact per-id check, which names the offending value.
    """
    values = obj[name]
    if not isinstance(values, list):
        raise BadLine(f"{name} must be a list of integers, got {type(values).__name__}")
    array = _fast_uint64(values)
    if array is None:
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT64_MAX:
                raise BadLine(f"{name} holds {value!r}; ids must be unsigned 64-bit integers")
        array = np.array(values, dtype=np.uint64)
    if len(array) != expected_len:
        raise BadLine(f"{name} has {len(array)} ids but {rule} gives {expected_len}")
    return array


def hash_list(obj: dict, name: str, expected_len: int, rule: str) -> tuple[int, ...]:
    """:func:`hash_array` as the tuple a ``RequestRecord`` holds."""
    return tuple(hash_array(obj, name, expected_len, rule).tolist())


def _fast_uint64(values: list) -> np.ndarray | None:
    try:
        array = np.array(values)
    except (OverflowError, ValueError, TypeError):
        return None
    if not len(values):
        return np.zeros(0, dtype=np.uint64)
    if array.dtype.kind not in "iu" or array.ndim != 1 or array.min() < 0:
        return None
    return array.astype(np.uint64, copy=False)


def stable_namespace(label: str, low_bits: int) -> int:
    """A deterministic uint64 prefix for ``label`` with the low ``low_bits`` bits clear.

    Used to move per-conversation ids into one global space: ``namespace | local_id``.
    blake2b, not ``hash()``, so ids are the same in every process.
    """
    digest = hashlib.blake2b(label.encode("utf-8"), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> low_bits) << low_bits


class SkipCounter:
    """Mixin for readers: raise or count a bad line depending on ``skip_bad``."""

    skip_bad: bool
    skipped: int

    def _bad(self, path: Path, line: int | None, problem: str) -> None:
        if not self.skip_bad:
            raise TraceFormatError(path, line, problem)
        self.skipped += 1


class JsonLinesReader(SkipCounter):
    """Base of the one-object-per-line formats: the block size, bad-line handling, and
    :meth:`_parsed`, which converts each good line and skips (or raises on) the bad ones."""

    def __init__(self, path: str | Path, *, block_tokens: int, skip_bad: bool = False) -> None:
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
        self.path = Path(path)
        self.block_tokens = block_tokens
        self.skip_bad = skip_bad
        self.skipped = 0

    def _parsed(self, convert) -> list:
        """``convert(line_number, obj)`` for every line; a ``BadLine`` from the file or from
        ``convert`` is counted or raised per ``skip_bad``. Resets ``skipped``."""
        self.skipped = 0
        out = []
        for line, obj in iter_json_lines(self.path):
            try:
                if isinstance(obj, BadLine):
                    raise obj
                out.append(convert(line, obj))
            except BadLine as problem:
                self._bad(self.path, line, str(problem))
        return out
