"""The ZMQ side of KV events, as vLLM's ``ZmqEventPublisher`` does it.

A PUB socket sends ``[topic, seq (8 bytes big-endian), payload]``; ``seq`` counts from 0 per
publisher lifetime. A ROUTER socket serves replays: a client sends ``start_seq`` (8 bytes)
and gets every buffered batch with ``seq >= start_seq`` as ``[id, b"", topic, seq, payload]``,
then the end marker ``[id, b"", b"", (-1 as 8 signed bytes), b""]``. ZMQ sockets are not
thread-safe, so one publisher thread owns both; :meth:`publish` only enqueues.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import deque

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KvEventPublisher:
    """Bind ``endpoint`` (PUB) and, optionally, ``replay_endpoint`` (ROUTER); loopback by default."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:0", replay_endpoint: str | None = None,
                 *, topic: str = "", buffer_steps: int = 10_000):
        import zmq

        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._router = None
        self.replay_endpoint = None
        if replay_endpoint is not None:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(replay_endpoint)
            self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode()
        self._seq = itertools.count()
        self._buffer: deque[tuple[bytes, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self.published = 0
        self._thread = threading.Thread(target=self._run, name="kvtier-kv-events", daemon=True)
        self._thread.start()

    def publish(self, payload: bytes) -> None:
        """Queue one encoded batch for sending (never blocks the engine)."""
        self._queue.put(payload)

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        if self._router is not None:
            poller.register(self._router, zmq.POLLIN)
        while True:
            try:
                payload = self._queue.get(timeout=0.02)
            except queue.Empty:
                payload = b""
            if payload is None:
                break
            if payload:
                self._send(payload)
            if self._router is not None and dict(poller.poll(0)):
                self._serve_replay()
        self._pub.close(linger=0)
        if self._router is not None:
            self._router.close(linger=0)

    def _send(self, payload: bytes) -> None:
        seq = next(self._seq).to_bytes(8, "big")
        self._pub.send_multipart([self._topic, seq, payload])
        self._buffer.append((seq, payload))
        self.published += 1

    def _serve_replay(self) -> None:
        import zmq

        while True:
            try:
                client, _, start = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:  # a malformed request: ignore it
                continue
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if int.from_bytes(seq, "big") >= first:
                    self._router.send_multipart([client, b"", self._topic, seq, payload])
            self._router.send_multipart([client, b"", b"", END_SEQ, b""])

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued, then close the sockets."""
        self._queue.put(None)
        self._thread.join(timeout_s)
