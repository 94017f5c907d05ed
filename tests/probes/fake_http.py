"""A loopback HTTP server that plays canned answers, for the HTTP pollers and scrapers."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeEngineHttp:
    """Serves ``routes[(method, path)]``: a list of (status, body bytes) answered in order
    (the last one repeats); a third item, when given, is the Content-Length to declare (a
    larger one than the body's: a page cut short, the connection closed after it). Records
    every request as (method, path)."""

    def __init__(self):
        self.routes: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                outer.requests.append((self.command, self.path))
                answers = outer.routes.get((self.command, self.path))
                status, body, *declared = (answers.pop(0) if len(answers) > 1 else answers[0]) \
                    if answers else (404, b"not found")
                self.send_response(status)
                self.send_header("Content-Length", str(declared[0] if declared else len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class TricklingHttp:
    """A loopback HTTP server that answers every request a byte at a time, ``every_s`` apart
    (its headers first if ``headers`` is set, else its body after whole headers): a reader
    whose timeout is per socket read never times out on it. ``connections`` counts the
    requests it has accepted."""

    def __init__(self, every_s: float = 0.3, *, headers: bool = False):
        import socket

        self.every_s, self.headers = every_s, headers
        self.connections = 0
        self._closed = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn):
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
        try:
            conn.recv(65536)
            if not self.headers:
                conn.sendall(head)
            for byte in (head if self.headers else b"x" * 100000):
                if self._closed.wait(self.every_s):
                    break
                conn.sendall(bytes([byte]))
        except OSError:  # the client gave up
            pass
        finally:
            conn.close()

    def close(self):
        self._closed.set()
        self._server.close()
