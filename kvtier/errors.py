"""How the command line reports a failure: one line on stderr, and an exit code by kind.

* bad input (a flag's value, a file that is missing, malformed or the wrong kind): exit 2;
* a runtime failure (a port in use, a full disk, a store locked by another process, a server
  that does not answer): exit 1.

Below ``kvtier/`` errors are ``ValueError`` (bad input) and ``OSError`` (runtime) subclasses;
:func:`explain` turns any exception into ``(message, exit_code)``. With ``--verbose`` the
command line prints the traceback after the line.
"""

from __future__ import annotations

import errno
import re

BAD_INPUT = 2
FAILURE = 1


class KvtierError(Exception):
    """A problem the message explains as-is: it names the flag or file, what is wrong and what
    to do. ``exit_code`` is :data:`BAD_INPUT` unless told otherwise."""

    def __init__(self, message: str, exit_code: int = BAD_INPUT):
        super().__init__(message)
        self.exit_code = exit_code


def failure(message: str) -> KvtierError:
    """A runtime failure (exit 1) whose message is shown as-is."""
    return KvtierError(message, FAILURE)


# errno values that mean the user named something unusable, not that the machine failed.
_BAD_INPUT_ERRNOS = {errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT, errno.EINVAL, errno.ENOENT,
                     errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG}


def explain(error: BaseException, flags: dict[str, str] | None = None) -> tuple[str, int]:
    """The one line and exit code for ``error``; ``flags`` maps the verb's argument names
    (``dest``) to their flags, so a validation message names ``--train-fraction``, not
    ``train_fraction``."""
    if isinstance(error, KvtierError):
        return str(error), error.exit_code
    if type(error).__module__.split(".")[0] in ("duckdb", "_duckdb"):
        return _duckdb_error(error)
    if isinstance(error, OSError):
        return _os_error(error)
    if isinstance(error, (ValueError, LookupError)):  # validation names the bad value
        return flag_names(_first_line(error), flags or {}), BAD_INPUT
    if isinstance(error, MemoryError):
        return "out of memory; use a smaller input (e.g. --max-requests) or a bigger host", FAILURE
    return (f"unexpected {type(error).__name__}: {_first_line(error)} (run with --verbose "
            "for the traceback, and report it)", FAILURE)


def _os_error(error: OSError) -> tuple[str, int]:
    import socket

    path = error.filename
    reason = error.strerror or _first_line(error)
    if isinstance(error, socket.gaierror):
        return f"unknown host: {reason}", BAD_INPUT
    if isinstance(error, FileNotFoundError) and path:
        return f"no such file or folder: {path}", BAD_INPUT
    if isinstance(error, IsADirectoryError) and path:
        return f"{path} is a folder; give a file", BAD_INPUT
    if isinstance(error, NotADirectoryError) and path:
        return f"{path}: part of the path is a file, not a folder", BAD_INPUT
    if isinstance(error, FileExistsError) and path:
        return f"{path} exists and is not a folder; give a folder", BAD_INPUT
    if error.errno == errno.ENOSPC:
        where = f"{path}: " if path else ""
        return f"{where}no space left on device; free some or choose another place", FAILURE
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and path:
        return f"{path}: {reason} (is it read-only?)", FAILURE
    if path:
        return f"{path}: {reason}", FAILURE
    code = BAD_INPUT if error.errno in _BAD_INPUT_ERRNOS and error.strerror is None else FAILURE
    return _first_line(error), code


def _duckdb_error(error: BaseException) -> tuple[str, int]:
    """DuckDB's own errors, without importing it: I/O is a runtime failure, the rest a file
    DuckDB could not take."""
    from kvtier.collector.storefile import damaged

    text = _first_line(error)
    file = re.search(r'from file "([^"]+)"', text)
    damage = damaged(file.group(1) if file else "a store", error)
    if damage is not None:
        return str(damage), BAD_INPUT
    if "No space left on device" in text:
        return "no space left on device (DuckDB could not write); free some or choose another place", FAILURE
    kind = type(error).__name__
    text = re.sub(r"^[A-Za-z ]+ Error: ", "", text)
    if kind == "IOException":
        return f"DuckDB could not read or write: {text}", FAILURE
    if kind in ("InvalidInputException", "ConversionException"):
        return f"DuckDB could not read the input: {text}", BAD_INPUT
    return (f"unexpected DuckDB {kind}: {text} (run with --verbose for the traceback, and "
            "report it)", FAILURE)


_SNAKE = re.compile(r"(?<![\w.\-/'\"])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w(/'\"])")


def flag_names(message: str, flags: dict[str, str]) -> str:
    """``message`` with argument names that are the verb's flags written as those flags."""
    return _SNAKE.sub(lambda m: flags.get(m.group(1), m.group(1)), message)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
