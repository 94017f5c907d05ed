"""The collector's HTTP server: Prometheus ``/metrics`` and a JSON ``/healthz``, one port.

prometheus_client's WSGI app answers ``/metrics`` (content negotiation and compression as
Prometheus expects); ``/healthz`` says whether every tap is running. Bounded as :data:`LIMITS`
says (:mod:`kvtier.collector.bounded_http`): a burst of clients waits in the listen backlog,
one past the cap is answered 503 and counted, an idle connection is closed. A threaded standard
library server runs both, so a slow scrape never blocks a health check. More JSON pages
come in as ``routes``: path -> ``handler(method, body, headers) -> (status, body)`` (the
guardrail's ``/guardrail``); a request body above :data:`MAX_BODY_BYTES` is refused unread.
"""

from __future__ import annotations

import socket
import threading
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app

from kvtier.collector import json_text
from kvtier.collector.bounded_http import BoundedServerMixin, ConnectionLimits

# Prometheus servers and health checks connect a few at a time and are answered in
# milliseconds: 64 at once is far above what a collector is asked, and a client that sends
# nothing for 10 s (a scrape's request comes at once) is let go.
LIMITS = ConnectionLimits(max_connections=64, idle_timeout_s=10.0)

MAX_BODY_BYTES = 64 << 10
_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large",
            503: "Service Unavailable"}


class _Server(BoundedServerMixin, WSGIServer):
    pass


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # scrapes every few seconds would flood the log
        pass


def serve(registry, host: str, port: int,
          health: Callable[[], tuple[bool, dict]] | None = None, routes: dict | None = None):
    """Bind ``host:port`` and serve in a daemon thread; returns ``(server, thread)``.

    ``OSError`` (``socket.gaierror`` for a host that does not resolve) if it cannot bind.
    """
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz" and health is not None:
            ok, body = health()
            data = (json_text.dumps(body) + "\n").encode()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
            return [data]
        if path in (routes or {}):
            return _route(routes[path], environ, start_response)
        if path in ("/", "/metrics"):
            return metrics(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"kvtier collector: /metrics and /healthz\n"]

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("KvtierHttpServer", (_Server,), {"address_family": family})
    server = server_class((host, port), _QuietHandler, limits=LIMITS)
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, name="kvtier-http", daemon=True)
    thread.start()
    return server, thread


def _route(handler, environ, start_response):
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if not 0 <= length <= MAX_BODY_BYTES:
        status, body = 413, {"error": f"a body of 0..{MAX_BODY_BYTES} bytes is expected"}
    else:
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                   if k.startswith("HTTP_")}
        status, body = handler(environ.get("REQUEST_METHOD", "GET"),
                               environ["wsgi.input"].read(length) if length else b"", headers)
    data = (json_text.dumps(body) + "\n").encode()
    start_response(f"{status} {_REASONS.get(status, '')}".strip(),
                   [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]
