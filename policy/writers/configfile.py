"""An engine config file as a push reads it: which file is edited, and its text in the form
the writers take.

* A symbolic link is followed: the file it points to is edited and the link stays a link.
* Anything but a regular file (a FIFO, a device, a socket) is refused from ``os.stat``,
  before it is opened, so a push never blocks on it.
* The writers see plain text: a UTF-8 byte-order mark removed and CRLF line ends read as
  LF. :meth:`ConfigFile.as_written` puts both back, so the file keeps its encoding and line
  ends and the diff shows only what kvtier changed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

BOM = "\ufeff"
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotAConfigFile(ValueError):
    """The path names something a push must not read or replace; the message says what."""


@dataclass(frozen=True)
class ConfigFile:
    """``path`` as given, ``target`` the file written (``path`` itself unless it is a link);
    ``text`` is ``None`` for a file that does not exist yet."""

    path: Path
    target: Path
    text: str | None
    bom: bool = False
    crlf: bool = False

    @property
    def is_link(self) -> bool:
        return self.target != self.path

    def as_written(self, text: str) -> str:
        """``text`` (LF line ends, no mark) in this file's encoding form."""
        if self.crlf:
            text = text.replace("\r\n", "\n").replace("\n", "\r\n")
        return BOM + text if self.bom else text


def read_config(path: str | Path) -> ConfigFile:
    """The config file at ``path``; :class:`NotAConfigFile` for a folder or a special file,
    ``UnicodeDecodeError`` for bytes that are not UTF-8, ``OSError`` if it cannot be read."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return ConfigFile(path, target, None)
    if stat.S_ISDIR(mode):
        raise NotAConfigFile(f"--config {path} is a folder; give the engine's config file")
    kind = next((what for test, what in _KINDS if test(mode)), None)
    if kind is not None or not stat.S_ISREG(mode):
        raise NotAConfigFile(f"--config {path} is {kind or 'not a regular file'}; give the "
                             "engine's config file (kvtier does not read or replace it)")
    raw = target.read_bytes().decode("utf-8")
    bom = raw.startswith(BOM)
    text = raw[len(BOM):] if bom else raw
    crlf = "\r\n" in text
    return ConfigFile(path, target, text.replace("\r\n", "\n") if crlf else text, bom, crlf)
