"""The collector's HTTP server: Prometheus ``/metrics`` and a JSON ``/healthz``, one port.

prometheus_client's WSGI app answers ``/metrics`` (content negotiation and compression as
Prometheus expects); ``/healthz`` says whether every tap is running. A threaded standard
library server runs both, so a slow scrape never blocks a health check.
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app

from kvtier.collector import json_text


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # scrapes every few seconds would flood the log
        pass


def serve(registry, host: str, port: int,
          health: Callable[[], tuple[bool, dict]] | None = None):
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
        if path in ("/", "/metrics"):
            return metrics(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"kvtier collector: /metrics and /healthz\n"]

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("KvtierHttpServer", (_Server,), {"address_family": family})
    server = server_class((host, port), _QuietHandler)
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, name="kvtier-http", daemon=True)
    thread.start()
    return server, thread
