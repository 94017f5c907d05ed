"""Reads an engine's argument file back (one ``--flag value`` per line), independently of the
writer's editor, so tests can check what it wrote."""

from __future__ import annotations


def args_get(text: str, flag: str) -> str | bool | None:
    """The value of ``flag`` (``True`` for a bare switch), ``None`` when the file lacks it."""
    for line in text.splitlines():
        words = line.strip().replace("=", " ", 1).split(None, 1)
        if words and words[0] == flag:
            return words[1].strip() if len(words) > 1 else True
    return None
