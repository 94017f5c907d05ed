"""Shared plumbing for probes that poll over HTTP: a background loop and a bounded GET/POST.

Scrapers expose ``poll()`` (one round, never raises for network or data problems) and
``start()``/``stop()`` which run ``poll()`` every ``interval_s`` in a daemon thread; tests
call ``poll()`` directly. Event pollers that feed the collector are taps instead
(:mod:`kvtier.collector.taps`): their ``poll()`` raises :class:`FetchError` so the service can
report and retry the engine.
"""

from __future__ import annotations

import http.client
import threading
import urllib.error
import urllib.request
from typing import Callable

#: Loopback by default: probes talk to the engine on the same node.
DEFAULT_HOST = "http://127.0.0.1"


class PollLoop:
    """Call ``poll`` every ``interval_s`` in a daemon thread until :meth:`stop`."""

    def __init__(self, poll: Callable[[], object], interval_s: float, name: str):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self._poll, self._interval_s, self._name = poll, interval_s, name
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._poll()
            self._stopping.wait(self._interval_s)


class FetchError(OSError):
    """The endpoint could not be reached, answered an error, or sent too much."""


def fetch(url: str, *, method: str = "GET", timeout_s: float = 5.0,
          max_bytes: int = 64 << 20) -> bytes:
    """The body of ``url``; :class:`FetchError` for any network or HTTP problem."""
    if not url.startswith(("http://", "https://")):
        raise FetchError(f"not an http(s) URL: {url!r}")
    data = b"" if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(max_bytes + 1)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise FetchError(f"{method} {url}: {exc}") from None
    if len(body) > max_bytes:
        raise FetchError(f"{method} {url}: body larger than {max_bytes} bytes")
    return body
