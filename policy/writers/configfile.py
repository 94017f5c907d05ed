"""An engine config file as a push reads it: which file is edited, and its text in the form
the writers take.

* A symbolic link is followed: the file it points to is edited and the link stays a link.
* Only a regular file of at most :data:`~kvtier.policy.writers.inputs.CONFIG_LIMIT_BYTES` is
  read (:func:`kvtier.policy.writers.inputs.read_regular`): a FIFO, a device or a socket is
  refused before a byte is read, so a push never blocks on it.
* A file the user may not write is refused (:func:`check_writable`), though the folder would
  let a push replace it; a replaced file keeps its mode, and its owner and group as far as
  the user may give them (:func:`keep_owner`; a note says what it cannot keep).
* The writers see plain text: a UTF-8 byte-order mark removed and CRLF line ends read as
  LF. :meth:`ConfigFile.as_written` puts both back, so the file keeps its encoding and line
  ends and the diff shows only what kvtier changed.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
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


class NotWritable(ValueError):
    """The user cannot write the config file, so a push must not replace it."""


def check_writable(path: Path, target: Path) -> tuple[str, ...]:
    """Refuse (:class:`NotWritable`) a config file the user may not write: a push replaces
    the file with a new one in a single rename, which the folder's permission allows even
    where the file's does not. Returns a note where the new file cannot keep the old one's
    owner or group (only root may give a file away): it will be the user's."""
    info = os.stat(target)
    if not _may_write(target):
        why = (f"it is {_name(info.st_uid, 'user')}'s, mode {stat.S_IMODE(info.st_mode):04o}"
               if not _mode_lets_write(info) else
               f"its mode {stat.S_IMODE(info.st_mode):04o} would, but it is immutable "
               "(chattr +i) or on a read-only mount")
        raise NotWritable(f"{path} is read-only for you ({_name(os.geteuid(), 'user')}): {why}; "
                          "kvtier push replaces only a file you may write: run it as the "
                          "file's owner, or make the file writable for you")
    if os.geteuid() == 0:
        return ()
    lost = []
    if info.st_uid != os.geteuid():
        lost.append(f"owner {_name(info.st_uid, 'user')} becomes {_name(os.geteuid(), 'user')}")
    if info.st_gid not in (os.getegid(), *os.getgroups()):
        lost.append(f"group {_name(info.st_gid, 'group')} becomes {_name(os.getegid(), 'group')}")
    if not lost:
        return ()
    return (f"{path} is replaced by a new file (one rename) that keeps its mode "
            f"{stat.S_IMODE(info.st_mode):04o}, but its {' and '.join(lost)}: only root gives "
            "a file away",)


def keep_owner(old: Path, new: Path) -> None:
    """Give ``new`` the owner and group of ``old`` as far as the user may: root keeps both,
    another user the group where it is one of theirs."""
    info = os.stat(old)
    for uid in (info.st_uid, -1):
        try:
            os.chown(new, uid, info.st_gid)
            return
        except PermissionError:
            continue


def _mode_lets_write(info: os.stat_result) -> bool:
    if os.geteuid() == 0:
        return True
    if info.st_uid == os.geteuid():
        return bool(info.st_mode & stat.S_IWUSR)
    if info.st_gid in (os.getegid(), *os.getgroups()):
        return bool(info.st_mode & stat.S_IWGRP)
    return bool(info.st_mode & stat.S_IWOTH)


def _may_write(path: Path) -> bool:
    if os.access in os.supports_effective_ids:
        return os.access(path, os.W_OK, effective_ids=True)
    return os.access(path, os.W_OK)


def _name(number: int, kind: str) -> str:
    try:
        return (pwd.getpwuid(number).pw_name if kind == "user" else grp.getgrgid(number).gr_name)
    except KeyError:
        return f"{kind} {number}"
