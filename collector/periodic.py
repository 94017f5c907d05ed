"""A background thread that calls one function every ``interval_s`` seconds.

The collector's flusher, OTLP pusher and maintenance share it. ``stop()`` wakes the thread
at once, waits for it, and then runs the work one last time in the caller's thread, so
what was pending at shutdown is not lost.
"""

from __future__ import annotations

import threading
from typing import Callable


class Periodic:
    def __init__(self, work: Callable[[], object], interval_s: float, name: str):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self._work, self.interval_s, self._name = work, interval_s, name
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then run the work once more (a final flush)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._work()

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            self._work()
