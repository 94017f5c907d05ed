"""A stand-in for vLLM's ``ZmqEventPublisher``, written from the documented wire format.

vLLM 0.33.0 ``vllm/distributed/kv_events.py``: live frames ``[topic, seq 8B BE, msgpack [ts, events, dp]]``
on a PUB socket; a ROUTER replay socket answers ``[id, b"", start_seq]`` with
``[id, b"", topic, seq, payload]`` per buffered batch and ``[id, b"", b"", -1, b""]``.

Single-threaded and explicit, so tests stay deterministic: it uses an XPUB socket and waits
for the subscriber's subscription before the first send (no slow-joiner loss), and serves
replays only when a test calls :meth:`serve_replay`.
"""

from __future__ import annotations

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(hashes, parent=None, tokens=(1, 2, 3, 4), medium="GPU", **extra) -> dict:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(tokens), "block_size": len(tokens), "lora_id": None,
            "medium": medium, "lora_name": None, **extra}


def removed(hashes, medium="GPU") -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


def cleared() -> dict:
    return {"type": "AllBlocksCleared"}


def payload(events, ts=1700000000.5, dp_rank=0) -> bytes:
    body = [ts, list(events)] + ([] if dp_rank is None else [dp_rank])
    return msgpack.packb(body, use_bin_type=True)


class FakePublisher:
    """PUB (bind or connect) + optional ROUTER replay, with vLLM's sequence rules."""

    def __init__(self, endpoint: str, *, bind: bool = True, replay: bool = True,
                 topic: bytes = b"", dp_rank: int = 0):
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if bind:
            self.pub.bind(endpoint)
            self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self.pub.connect(endpoint)
            self.endpoint = endpoint
        self.replay = None
        self.replay_endpoint = None
        if replay:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind("tcp://127.0.0.1:0")
            self.replay_endpoint = self.replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self.topic, self.dp_rank = topic, dp_rank
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []

    def wait_for_subscriber(self, tap=None, rounds: int = 100) -> None:
        """Wait for the subscription message. A bound SUB socket only attaches a new peer
        when its owner touches it, so a ``tap`` that binds is polled meanwhile."""
        for _ in range(rounds):
            if tap is not None:
                tap.poll(0)
            if self.pub.poll(50):
                self.pub.recv()
                return
        raise TimeoutError("no subscriber joined")

    def publish(self, events, *, ts=1700000000.5, send=True) -> int:
        """Publish one batch (``send=False`` buffers it for replay only: a lost frame)."""
        seq = self.seq
        body = payload(events, ts=ts, dp_rank=self.dp_rank)
        self.buffer.append((seq, body))
        if send:
            self.send_raw([self.topic, seq.to_bytes(8, "big"), body])
        self.seq += 1
        return seq

    def send_raw(self, parts) -> None:
        self.pub.send_multipart(parts)

    def serve_replay(self, timeout_s: float = 5.0) -> int:
        """Answer one replay request; returns the start sequence asked for."""
        if not self.replay.poll(int(timeout_s * 1000)):
            raise TimeoutError("no replay request arrived")
        client, empty, start_bytes = self.replay.recv_multipart()
        start = int.from_bytes(start_bytes, "big")
        for seq, body in self.buffer:
            if seq >= start:
                self.replay.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), body])
        self.replay.send_multipart([client, b"", b"", END_SEQ, b""])
        return start

    def close(self) -> None:
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)
