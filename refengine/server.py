"""The engine's HTTP server: OpenAI ``/v1/completions`` (streaming and not), ``/metrics``,
``/health``, ``/v1/models`` and ``/admin/tiers`` (switch the tier configuration).

One engine thread steps the engine (continuous batching); each HTTP connection has its own
thread that submits a request and waits on a queue for its tokens, so concurrent requests
really queue and batch. Binds 127.0.0.1 unless told otherwise. Bounded as
:mod:`kvtier.collector.bounded_http` says: ``max_connections`` at once (a burst of that many
waits in the listen backlog; one past it is answered 503 and counted on ``/metrics``), and a
client that sends or reads nothing for ``idle_timeout_s`` is let go. Optionally publishes vLLM
KV events over ZMQ and flushes the recorder into a DuckDB trace store.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer

from kvtier.collector import json_text
from kvtier.collector.bounded_http import BoundedServerMixin, ConnectionLimits, ServerMetrics
from kvtier.collector.events import Origin
from kvtier.collector.recorder import Recorder
from kvtier.refengine.api import ApiError, chunk_body, completion_body, parse_completion, tier_tokens, usage
from kvtier.refengine.config import EngineConfig, TierConfig
from kvtier.refengine.engine import ReferenceEngine
from kvtier.refengine.metrics import EngineMetrics
from kvtier.refengine.request_body import MAX_BODY_BYTES, content_length, parse_json
from kvtier.refengine.sequence import Sequence

log = logging.getLogger(__name__)
MODEL_NAME = "kvtier-reference"
CLIENT_GONE = "the client disconnected"
CLIENT_CHECK_S = 0.2  # how often a waiting request looks whether its client is still there


@dataclass(frozen=True)
class ServerSettings:
    """Where to listen and what to publish. ``kv_events_endpoint=None`` publishes nothing."""

    host: str = "127.0.0.1"
    port: int = 8000
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""
    store_path: str | None = None
    instance: str = "reference"
    request_timeout_s: float = 600.0
    max_connections: int = 256  # beyond this many at once, a new connection gets a 503
    idle_timeout_s: float = 60.0  # a client that stops sending (or reading) is let go


class EngineServer:
    """Start with :meth:`start` (returns self), stop with :meth:`stop` (always, in ``finally``)."""

    def __init__(self, config: EngineConfig, settings: ServerSettings = ServerSettings(), *,
                 recorder: Recorder | None = None):
        self.settings = settings
        self.recorder = recorder or Recorder(Origin("reference", settings.instance,
                                                    f"{settings.instance}/{int(time.time() * 1000)}"))
        self.publisher = self._publisher(settings)
        self.engine = ReferenceEngine(config, self.recorder, on_request=self._observe,
                                      publish=self.publisher.publish if self.publisher else None)
        self.metrics = EngineMetrics(
            MODEL_NAME, usage=lambda: self.engine.kv.gpu.used_blocks / self.engine.kv.gpu.num_blocks,
            running=lambda: len(self.engine.scheduler.running),
            waiting=lambda: self.engine.queued_requests,
            cache_info={"block_size": str(config.block_size_tokens), "enable_prefix_caching": "True"},
            transfers=self.engine.transfers.snapshot)
        self._ids = itertools.count()
        self._wake, self._stopping = threading.Event(), threading.Event()
        self._store = self._flusher = None
        self._http = self._threads = None

    @staticmethod
    def _publisher(settings: ServerSettings):
        if settings.kv_events_endpoint is None:
            return None
        from kvtier.refengine.kv_publisher import KvEventPublisher

        return KvEventPublisher(settings.kv_events_endpoint, settings.kv_events_replay_endpoint,
                                topic=settings.kv_events_topic)

    def _observe(self, record) -> None:
        self.metrics.observe(record)

    # ---- lifecycle
    def start(self) -> "EngineServer":
        if self.settings.store_path:
            from kvtier.collector.flusher import Flusher
            from kvtier.collector.store import TraceStore

            self._store = TraceStore(self.settings.store_path)
            self._flusher = Flusher(self.recorder, self._store, interval_s=0.5).start()
        self._http = _HttpServer((self.settings.host, self.settings.port), _handler(self),
                                 limits=ConnectionLimits(self.settings.max_connections,
                                                         self.settings.idle_timeout_s))
        self.metrics.registry.register(ServerMetrics(self._http))
        self._threads = [threading.Thread(target=self._loop, name="kvtier-engine", daemon=True),
                         threading.Thread(target=self._http.serve_forever, name="kvtier-http", daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for thread in self._threads or ():
            thread.join(30)
        self.engine.close()
        if self.publisher is not None:
            self.publisher.close()
        if self._flusher is not None:
            self._flusher.stop()
            self._store.close()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                busy = self.engine.step()
            except Exception as error:  # keep serving; end the requests the step held
                log.exception("engine step failed")
                self.engine.fail_all(f"engine step failed: {type(error).__name__}: {error}")
                busy = False
            if not busy:
                self._wake.wait(0.05)
                self._wake.clear()

    # ---- requests
    def submit(self, prompt_ids: list[int], max_tokens: int) -> tuple[Sequence, queue.Queue]:
        """Queue a request; its tokens (then ``None``) arrive on the returned queue."""
        tokens: queue.Queue = queue.Queue()
        seq = Sequence(f"cmpl-{next(self._ids)}", prompt_ids, max_tokens, time.time(),
                       on_token=tokens.put, on_finish=lambda s: tokens.put(None))
        self.engine.submit(seq)
        self._wake.set()
        return seq, tokens

    def abort(self, seq: Sequence, reason: str) -> None:
        """End a request nobody waits for any more; the engine frees its slot and blocks."""
        self.engine.abort(seq, reason)
        self._wake.set()

    def switch_tiers(self, fields) -> TierConfig:
        """Ask for a tier switch; ``ValueError`` naming the field if ``fields`` (a JSON object)
        is not a tier configuration this host can allocate."""
        if not isinstance(fields, dict):
            raise ValueError(f"the body must be a JSON object of tier fields, got {type(fields).__name__}")
        allowed = [f.name for f in dataclasses.fields(TierConfig)]
        unknown = sorted(set(fields) - set(allowed))
        if unknown:
            raise ValueError(f"unknown tier fields {unknown}; allowed: {', '.join(allowed)}")
        tiers = TierConfig(**fields)  # types and ranges, each error naming its field
        self.engine.reconfigure(tiers)
        self._wake.set()
        return tiers


def _handler(server: EngineServer):
    class Handler(_Handler):
        owner = server
    return Handler


class _Handler(BaseHTTPRequestHandler):
    owner: EngineServer
    server_version = "kvtier-reference"

    def log_message(self, fmt, *args) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, self.owner.metrics.exposition(), "text/plain; version=0.0.4")
        elif self.path == "/health":
            self._send(200, b"", "text/plain")
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})
        elif self.path == "/admin/tiers":
            engine = self.owner.engine
            self._json(200, {**dataclasses.asdict(engine.config.tiers), "switch_pending": engine.switch_pending,
                             "switch_error": engine.switch_error})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        try:
            body = self._body()
            if self.path == "/v1/completions":
                self._complete(body)
            elif self.path == "/admin/tiers":
                try:
                    tiers = self.owner.switch_tiers(body)
                except (ValueError, TypeError) as error:
                    raise ApiError(str(error)) from None
                self._json(202, {"pending": dataclasses.asdict(tiers)})
            else:
                raise ApiError(f"no route {self.path}", 404)
        except ApiError as error:
            self._json(error.status, error.body())
        except OSError as error:  # the client went away or stalled: nobody to answer
            log.debug("%s: %s", self.address_string(), error)
            self.close_connection = True
        except Exception as error:  # answer, never leave the client waiting on a traceback
            log.exception("request %s failed", self.path)
            self._json(500, ApiError(f"{type(error).__name__}: {error}", 500).body())

    def _body(self):
        """The request's JSON, read within bounds: 400 for a malformed or negative
        Content-Length, chunked bodies or nesting deeper than MAX_JSON_DEPTH, 413 above
        MAX_BODY_BYTES (the body is not read then, and the connection closes)."""
        if self.headers.get("Transfer-Encoding"):
            raise ApiError("chunked request bodies are not accepted; send Content-Length", 411)
        length = content_length(self.headers.get_all("Content-Length") or [])
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise ApiError(f"body of {length} bytes exceeds the limit of {MAX_BODY_BYTES} bytes", 413)
        data = self.rfile.read(length) if length else b""
        if len(data) < length:
            raise OSError(f"body ended after {len(data)} of {length} bytes")
        return parse_json(data or b"{}")

    def _complete(self, body) -> None:
        owner = self.owner
        request = parse_completion(body, owner.engine.config.vocab_size, MODEL_NAME)
        try:
            seq, tokens = owner.submit(request.prompt_ids, request.max_tokens)
        except ValueError as error:
            raise ApiError(str(error)) from None
        created = int(time.time())
        try:
            self._respond(request, seq, tokens, created)
        finally:  # the client went away or waited too long: free its slot and blocks now
            if not seq.finished and seq.error is None:
                owner.abort(seq, CLIENT_GONE)

    def _respond(self, request, seq, tokens: queue.Queue, created: int) -> None:
        owner = self.owner
        if not request.stream:
            try:
                self._drain(tokens)
            except queue.Empty:
                raise ApiError(f"no answer within {owner.settings.request_timeout_s} s", 504) from None
            if seq.error is not None:
                raise ApiError(seq.error, 500)
            self._json(200, completion_body(seq, request.model, created))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            for token in self._drain(tokens, each=True):
                self._event(chunk_body(seq.request_id, request.model, created, [token]))
        except queue.Empty:
            error = f"no answer within {owner.settings.request_timeout_s} s"
        else:
            error = seq.error
        if error is not None:
            self._event(ApiError(error, 500).body())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        final = chunk_body(seq.request_id, request.model, created, [], "length")
        final["kvtier"] = tier_tokens(seq)
        if request.include_usage:
            final["usage"] = usage(seq)
        self._event(final)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _drain(self, tokens: queue.Queue, each: bool = False):
        """Tokens until the finish marker; a generator when ``each``, else a list. While
        waiting, a client that hung up raises ``ConnectionAbortedError``."""
        def gen():
            deadline = time.monotonic() + self.owner.settings.request_timeout_s
            checked = time.monotonic()
            while True:
                now = time.monotonic()
                if now - checked >= CLIENT_CHECK_S:  # tokens may keep coming: check anyway
                    checked = now
                    if self._client_gone():
                        raise ConnectionAbortedError(CLIENT_GONE)
                try:
                    token = tokens.get(timeout=min(CLIENT_CHECK_S, max(deadline - now, 0)))
                except queue.Empty:
                    if time.monotonic() >= deadline:
                        raise
                    continue
                if token is None:
                    return
                yield token
        return gen() if each else list(gen())

    def _client_gone(self) -> bool:
        """The peer closed its end: readable with nothing to read (it sends nothing more
        after its request), or the socket errors."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except (OSError, ValueError):
            return True

    def _event(self, body: dict) -> None:
        self.wfile.write(b"data: " + json_text.dumps(body).encode() + b"\n\n")
        self.wfile.flush()

    def _json(self, status: int, body: dict) -> None:
        self._send(status, json_text.dumps(body).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _HttpServer(BoundedServerMixin, HTTPServer):
    """One thread per connection, bounded (see the module); a refused connection reads an
    OpenAI-style error."""

    def overload_body(self) -> tuple[bytes, str]:
        message = (f"too many connections (the engine serves at most "
                   f"{self.limits.max_connections} at once); retry later")
        return json_text.dumps(ApiError(message, 503).body()).encode(), "application/json"
