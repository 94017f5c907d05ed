"""A loopback HTTP server that plays canned answers, for the HTTP pollers and scrapers."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeEngineHttp:
    """Serves ``routes[(method, path)]``: a list of (status, body bytes) answered in order
    (the last one repeats). Records every request as (method, path)."""

    def __init__(self):
        self.routes: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                outer.requests.append((self.command, self.path))
                answers = outer.routes.get((self.command, self.path))
                status, body = (answers.pop(0) if len(answers) > 1 else answers[0]) \
                    if answers else (404, b"not found")
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
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
