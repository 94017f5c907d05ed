"""Input checks where inputs enter: output paths, numbers, addresses. Standard library only.

Each check raises :class:`kvtier.errors.KvtierError` naming the flag, what is wrong and what
to do, before a verb starts work (so a bad ``--out`` does not waste a long replay).
"""

from __future__ import annotations

import errno
import ipaddress
import math
import sys
from pathlib import Path

from kvtier.errors import KvtierError, failure


def output_dir(path: str | Path, flag: str) -> Path:
    """A folder to write into: missing is fine (it is created), a file is not."""
    path = Path(path)
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                what = "is a file" if part == path else f"is below the file {part}"
                raise KvtierError(f"{flag} {path} {what}; give a folder (it is created if missing)")
            break
    return path


def writable_dir(path: str | Path, flag: str) -> Path:
    """:func:`output_dir`, created now, that this process can write into (a read-only folder
    would otherwise fail only at the first write, perhaps long after the start)."""
    import tempfile

    path = output_dir(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".kvtier-write-check-"):
            pass
    except OSError as error:
        raise KvtierError(f"{flag} {path}: cannot write there ({error.strerror or error}); "
                          "give a folder this user can write") from None
    return path


def output_file(path: str | Path, flag: str) -> Path:
    """A file to write: missing is fine, a folder (or a file in its path) is not."""
    path = Path(path)
    if path.is_dir():
        raise KvtierError(f"{flag} {path} is a folder; give a file name, e.g. {path / 'out.json'}")
    for part in path.parents:
        if part.exists():
            if not part.is_dir():
                raise KvtierError(f"{flag} {path} is below the file {part}; give a path in a folder")
            break
    return path


def input_path(path: str | Path, flag: str) -> Path:
    """A file or folder to read (a trace may be either)."""
    path = Path(path)
    if not path.exists():
        raise KvtierError(f"{flag} {path}: no such file or folder")
    return path


def positive(value: float | None, flag: str, *, allow_zero: bool = False) -> None:
    """``value`` is a finite number > 0 (or >= 0); ``None`` (not given) passes."""
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise KvtierError(f"{flag} must be a number {bound}, got {value:g}")


def non_empty(text: str | None, flag: str) -> None:
    if text is not None and not text.strip():
        raise KvtierError(f"{flag} must not be empty")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost (what other hosts cannot reach)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(verb: str, what: str, host: str, port: int | str | None = None) -> None:
    """One warning line on stderr when ``host`` is not a loopback address."""
    if not is_loopback(host):
        where = f"{host}:{port}" if port is not None else host
        print(f"kvtier {verb}: warning: {what} listens on {where}, reachable from other hosts "
              "(the default is 127.0.0.1)", file=sys.stderr, flush=True)


def zmq_host(endpoint: str) -> str | None:
    """The host of a ``tcp://HOST:PORT`` endpoint (``None`` for ipc/inproc)."""
    if not endpoint.startswith("tcp://"):
        return None
    rest = endpoint[len("tcp://"):]
    host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return "0.0.0.0" if host == "*" else host


def address_error(flag: str, address: str, error: BaseException) -> KvtierError:
    """A bind/connect failure as the user's flag: exit 2 for an address that cannot work
    (unknown host, not this host's, unknown protocol), exit 1 when it is busy."""
    import socket

    code = getattr(error, "errno", None)
    if isinstance(error, socket.gaierror):
        return KvtierError(f"{flag} {address}: unknown host; give an address of this machine, "
                           "e.g. 127.0.0.1")
    if code == errno.EADDRNOTAVAIL:
        return KvtierError(f"{flag} {address}: not an address of this machine; give one it has, "
                           "e.g. 127.0.0.1 or 0.0.0.0")
    if code in (errno.EPROTONOSUPPORT, errno.EINVAL):
        return KvtierError(f"{flag} {address}: not a usable endpoint ({_reason(error)}); "
                           "use e.g. tcp://127.0.0.1:5557")
    if code == errno.EADDRINUSE:
        return failure(f"{flag} {address}: address already in use (another kvtier or engine "
                       "running?); stop it or pick another port (0: any free port)")
    if code in (errno.EACCES, errno.EPERM):
        return failure(f"{flag} {address}: permission denied (ports below 1024 need root); "
                       "pick a port above 1024")
    return failure(f"{flag} {address}: {_reason(error)}")


def _reason(error: BaseException) -> str:
    reason = getattr(error, "strerror", None) or str(error)
    return reason.strip().splitlines()[0] if reason.strip() else type(error).__name__


def check_cold_needs_cpu(cold_tokens: str | None, cpu_tokens: str | None) -> None:
    """A cold tier without a CPU tier is never reached (promotions stage through CPU)."""
    if cold_tokens and _nonzero(cold_tokens) and not (cpu_tokens and _nonzero(cpu_tokens)):
        raise KvtierError(f"--cold-tokens {cold_tokens} needs --cpu-tokens: cold promotions stage "
                          "through the CPU tier, so without one the cold tier is never used")


def _nonzero(capacity: str) -> bool:
    return any(d in capacity for d in "123456789") or "inf" in capacity.lower()
