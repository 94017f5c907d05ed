"""Progress bars for long work, drawn on stderr only when it is a terminal.

``rich`` is imported on first use so that ``kvtier --help`` stays fast.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def enabled() -> bool:
    return sys.stderr.isatty()


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Yield ``items`` while drawing a progress bar (a no-op when stderr is not a TTY)."""
    if not enabled():
        yield from items
        return
    from rich.progress import track as rich_track

    yield from rich_track(items, description=description, total=total, transient=True,
                          console=_console())


@contextmanager
def task(description: str, total: float | None = None):
    """A progress task advanced by hand: ``with task("ingest", total=n) as advance: advance(k)``."""
    if not enabled():
        yield lambda amount=1: None
        return
    from rich.progress import Progress

    with Progress(console=_console(), transient=True) as bar:
        task_id = bar.add_task(description, total=total)
        yield lambda amount=1: bar.advance(task_id, amount)


def _console():
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def progress_lines(say=print):
    """A sink for progress lines from long work: a live status line on a terminal, else
    plain lines through ``say``."""
    if not enabled():
        yield lambda line: say(f"  {line}")
        return
    from rich.status import Status

    with Status("", console=_console()) as status:
        yield status.update
