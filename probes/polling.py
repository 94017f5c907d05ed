"""Shared plumbing for probes that poll over HTTP: a background loop and a bounded GET/POST.

Scrapers expose ``poll()`` (one round, never raises for network or data problems) and
``start()``/``stop()`` which run ``poll()`` every ``interval_s`` in a daemon thread; tests
call ``poll()`` directly. Event pollers that feed the collector are taps instead
(:mod:`kvtier.collector.taps`): their ``poll()`` raises :class:`FetchError` so the service can
report and retry the engine.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.error
import urllib.parse
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
    """The endpoint could not be reached, answered an error, sent too much or too little, or
    did not finish within the request's deadline."""


def check_url(url: str) -> None:
    """``ValueError`` unless ``url`` is an http(s) URL that names a host (and a valid port)."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be http(s), got {url!r}")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"url {url!r} holds spaces or control characters")
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 -- raises for a port that is not one
    except ValueError:
        raise ValueError(f"url {url!r} has a port that is not a number in 0..65535") from None
    if not parts.hostname:
        raise ValueError(f"url {url!r} names no host")


def fetch(url: str, *, method: str = "GET", timeout_s: float = 5.0,
          max_bytes: int = 64 << 20, deadline: "Deadline | None" = None) -> bytes:
    """The whole body of ``url``, read within ``timeout_s`` (connect, headers and body together:
    a server that trickles a byte at a time cannot hold the caller longer). :class:`FetchError`
    for any network or HTTP problem, a body above ``max_bytes`` or shorter than its
    ``Content-Length``, and a request past its deadline. ``deadline`` (a fresh
    :class:`Deadline`) lets another thread end the request at once (:meth:`Deadline.interrupt`)."""
    if not url.startswith(("http://", "https://")):
        raise FetchError(f"not an http(s) URL: {url!r}")
    deadline = deadline or Deadline(timeout_s)
    opener = urllib.request.build_opener(_HttpHandler(deadline), _HttpsHandler(deadline))
    request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    try:
        with deadline, opener.open(request, timeout=timeout_s) as response:
            body = _whole_body(response, max_bytes)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        if deadline.ended is None:
            raise FetchError(f"{method} {url}: {exc}") from None
    if deadline.ended is not None:
        raise FetchError(f"{method} {url}: {deadline.ended}") from None
    return body


def _whole_body(response, max_bytes: int) -> bytes:
    chunks, size = [], 0
    while chunk := response.read(min(1 << 20, max_bytes + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise FetchError(f"body larger than {max_bytes} bytes")
    declared = response.headers.get("Content-Length", "")
    if (declared.isdigit() and size < int(declared)
            and "chunked" not in response.headers.get("Transfer-Encoding", "").lower()):
        raise FetchError(f"the body ended after {size:,} of the {int(declared):,} bytes its "
                         "Content-Length promised")
    return b"".join(chunks)


class Deadline:
    """The end of one request: connect, headers and body together. The request's sockets are
    registered as they connect; when ``timeout_s`` has passed, or :meth:`interrupt` is called
    from another thread, they are shut down, so a read blocked on a peer that trickles bytes
    returns at once and the request fails (``ended`` says why). Used once, as a context."""

    def __init__(self, timeout_s: float):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self._at = time.monotonic() + timeout_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._watched: list[socket.socket] = []  # duplicates of the request's sockets
        self._done = False
        self.ended: str | None = None

    def left_s(self) -> float:
        return max(0.001, self._at - time.monotonic())

    def __enter__(self) -> "Deadline":
        threading.Thread(target=self._watch, name="kvtier-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._done = True
            for sock in self._watched:
                sock.close()
            self._watched.clear()
        self._wake.set()

    def interrupt(self) -> None:
        """End the request now (from any thread); a no-op once it finished."""
        self._end("stopped before it finished")

    def connect(self, address, timeout=None, source_address=None) -> socket.socket:
        """``socket.create_connection``, its wait bounded by what is left, the socket watched."""
        sock = socket.create_connection(address, self.left_s(), source_address)
        sock.settimeout(self.left_s() + 1.0)  # a backstop: the deadline ends a read first
        with self._lock:
            if self._done:
                return sock
            self._watched.append(sock.dup())  # shutting the duplicate down ends the connection
            ended = self.ended is not None
        if ended:
            self._shutdown(sock)
        return sock

    def _watch(self) -> None:
        if not self._wake.wait(self._at - time.monotonic()):
            self._end(f"no complete answer within {self.timeout_s:g} s (connect, headers and "
                      "body together)")

    def _end(self, why: str) -> None:
        with self._lock:
            if self._done or self.ended is not None:
                return
            self.ended = why
            for sock in self._watched:
                self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed by its peer
            pass


class _WatchedHttp(http.client.HTTPConnection):
    def __init__(self, *args, deadline: Deadline, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = deadline.connect


class _WatchedHttps(http.client.HTTPSConnection):
    def __init__(self, *args, deadline: Deadline, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = deadline.connect


class _HttpHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline):
        super().__init__()
        self._deadline = deadline

    def http_open(self, req):
        return self.do_open(_WatchedHttp, req, deadline=self._deadline)


class _HttpsHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline):
        super().__init__()
        self._deadline = deadline

    def https_open(self, req):
        return self.do_open(_WatchedHttps, req, context=self._context, deadline=self._deadline)
