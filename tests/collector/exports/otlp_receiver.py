"""A real OTLP/HTTP receiver on loopback for tests: decodes opentelemetry-proto requests.

It answers ``POST /v1/metrics`` and ``POST /v1/traces`` (protobuf, optionally gzip) with an
empty success response and keeps every decoded request for the test to inspect.
"""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)

ROUTES = {"/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
          "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse)}


class OtlpReceiver:
    def __init__(self):
        self.requests: dict[str, list] = {path: [] for path in ROUTES}
        self.headers: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                route = ROUTES.get(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if route is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request_type, response_type = route
                message = request_type()
                message.ParseFromString(body)
                receiver.requests[self.path].append(message)
                receiver.headers.append(dict(self.headers))
                payload = response_type().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, path: str, count: int = 1, timeout_s: float = 10.0) -> list:
        deadline = time.monotonic() + timeout_s
        while len(self.requests[path]) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.requests[path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
