"""An engine config file as a push reads it: which file is edited, and its text in the form
the writers take.

* A symbolic link is followed: the file it points to is edited and the link stays a link.
* Only a regular file of at most :data:`~kvtier.policy.writers.inputs.CONFIG_LIMIT_BYTES` is
  read (:func:`kvtier.policy.writers.inputs.read_regular`): a FIFO, a device or a socket is
  refused before a byte is read, so a push never blocks on it.
* The writers see plain text: a UTF-8 byte-order mark removed and CRLF line ends read as
  LF. :meth:`ConfigFile.as_written` puts both back, so the file keeps its encoding and line
  ends and the diff shows only what kvtier changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kvtier.policy.writers.inputs import CONFIG_LIMIT_BYTES, read_regular

BOM = "\ufeff"
ADVICE = "give the engine's config file (kvtier does not read or replace it)"


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
    """The config file at ``path``; :class:`~kvtier.policy.writers.inputs.NotReadable` for a
    folder, a special file or one over the size limit, ``UnicodeDecodeError`` for bytes that
    are not UTF-8, ``OSError`` if it cannot be read."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        raw = read_regular(target, f"--config {path}", CONFIG_LIMIT_BYTES, ADVICE).decode("utf-8")
    except FileNotFoundError:
        return ConfigFile(path, target, None)
    bom = raw.startswith(BOM)
    text = raw[len(BOM):] if bom else raw
    crlf = "\r\n" in text
    return ConfigFile(path, target, text.replace("\r\n", "\n") if crlf else text, bom, crlf)

