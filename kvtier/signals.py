"""Stop a verb on SIGTERM and SIGHUP exactly as on Ctrl-C.

A service manager stops a process with SIGTERM (systemd, Kubernetes, ``docker stop``) and a
closed terminal sends SIGHUP; Python only turns SIGINT into ``KeyboardInterrupt``. Inside
:func:`stop_on_signals` both raise :class:`Stopped` (a ``KeyboardInterrupt`` carrying the
signal number) in the main thread, so every verb's Ctrl-C path (stop children and servers,
flush the store) runs for all three; the command line then says "stopped by SIGTERM" and
exits 128 + the signal number. The previous handlers come back on exit. Standard library only.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """Raised in the main thread when a stop signal arrives; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum, frame) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Stopped` while the block runs (main thread only;
    elsewhere the block runs unchanged, since Python delivers signals to the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
