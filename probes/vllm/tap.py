"""The vLLM KV-event tap: a ZMQ SUB socket that turns vLLM's event stream into batches.

Run it with ``vllm serve ... --kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": ..., "replay_endpoint": ...}'``. vLLM's publisher *binds*
when its endpoint has a wildcard (``tcp://*:5557``; the tap then connects) and *connects*
otherwise (``tcp://collector:5557``; the tap binds, so one collector socket can serve many
engines, told apart by ``topic``). Each data-parallel rank has its own publisher, on the
configured port plus the rank.

The tap owns its sockets and is driven by :meth:`VllmEventTap.poll` from one thread (the
collector service's :class:`kvtier.collector.taps.TapRunner`, or a test). Every
decoded vLLM batch becomes one :class:`kvtier.collector.batch.EventBatch` handed to ``on_batch``,
with the publisher's sequence number as the batch sequence and a ``source`` that is fresh
per publisher incarnation (so a replayed batch is stored once, and a restarted publisher,
whose sequence restarts at 0, is not mistaken for a replay).

A restarted *collector* resumes each stream where its store left off (``resume``: the
stream's last stored source and sequence), so what the publisher sent meanwhile is a gap:
counted, and asked of the publisher's replay socket when one is configured.

Bad frames never stop the tap: they are counted in :attr:`VllmEventTap.stats` and logged.
On stop, :meth:`VllmEventTap.drain` hands over what already reached the sockets before they
close.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from kvtier.collector.batch import EventBatch
from kvtier.collector.columns import Rejections
from kvtier.collector.events import Origin
from kvtier.collector.peer_monitor import ConnectionMonitor
from kvtier.collector.taps import count_queued, drain_until_quiet
from kvtier.probes.vllm.replay_sockets import ReplaySockets
from kvtier.probes.vllm.streams import StreamState
from kvtier.probes.vllm.tap_config import TapStats, VllmTapConfig
from kvtier.probes.vllm.wire import Frame, FrameError, decode_payload, decoded_columns, split_frame

log = logging.getLogger(__name__)

__all__ = ["TapStats", "VllmEventTap", "VllmTapConfig"]

_ROUND_MESSAGES = 1000  # messages read from one socket before the next socket's turn


def _wire_columns():
    try:
        from kvtier.probes.vllm import wire_columns
    except ImportError as error:  # a checkout whose extensions were never built
        raise ImportError(f"{error}; build kvtier's compiled extensions: `make ext` in a "
                          "checkout (pip install builds them)") from None
    return wire_columns


@dataclass
class _Stream:
    """One publisher's progress, and its rows (GPU residency applied) since the last flush."""

    state: StreamState
    source: str
    rows: object  # wire_columns.StreamColumns
    pending_seq: int | None = None
    rejected: Rejections = field(default_factory=Rejections)


class _Decoded(NamedTuple):
    """A frame whose rows wait in the tap's frame buffer."""

    frame: Frame
    dp_rank: int | None
    bad_events: int = 0
    rejected: Rejections | None = None


class VllmEventTap:
    """Subscribe to vLLM KV events; hand each decoded batch to ``on_batch``.

    ``clock`` (Unix seconds) names publisher incarnations and times replay requests.
    ``resume(prefix)`` answers, for a stream first seen, the source (a name starting with
    ``prefix``) and the highest sequence the store holds from it, or ``None``: the stream then
    continues that source (:meth:`kvtier.collector.store.TraceStore.latest_source`).
    Not thread-safe: use either :meth:`poll` from one thread, or :meth:`start`.
    """

    def __init__(self, config: VllmTapConfig, on_batch: Callable[[EventBatch], None], *,
                 clock: Callable[[], float] = time.time,
                 resume: Callable[[str], tuple[str, int] | None] | None = None):
        self.config = config
        self._on_batch = on_batch
        self._clock = clock
        self._resume = resume
        self._columns = _wire_columns()
        self._frame_rows = self._columns.FrameColumns()
        self.stats = TapStats()
        self._streams: dict[tuple[bytes, int], _Stream] = {}
        self._ctx = self._sub = self._poller = None
        self._connections: ConnectionMonitor | None = None  # a connecting tap's links
        self._replay: ReplaySockets | None = None
        self._bound: list[str] = []

    @property
    def name(self) -> str:
        return ",".join(self.config.endpoints)

    poll_every_s = 0.0  # poll() waits for messages itself

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> list[str]:
        """Create and bind/connect the sockets (idempotent). Returns the bound endpoints.

        ``OSError`` (with ZMQ's errno: address in use, not this host's, unknown protocol)
        when an endpoint cannot be used; nothing stays open then.
        """
        if self._sub is not None:
            return self._bound
        import zmq

        self._ctx = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, self.config.receive_hwm)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
        self._bound = []
        if not self.config.bind:  # ZMQ retries and drops silently: watch it (before connecting)
            self._connections = ConnectionMonitor(
                self._sub, self.config.endpoints, f"{self.config.engine} KV-event tap",
                self.config.connect_grace_s)
        for endpoint in self.config.endpoints:
            try:
                if self.config.bind:
                    self._sub.bind(endpoint)
                    self._bound.append(self._sub.getsockopt_string(zmq.LAST_ENDPOINT))
                else:
                    self._sub.connect(endpoint)
            except zmq.ZMQError as error:
                self.close()
                verb = "bind" if self.config.bind else "connect to"
                raise OSError(error.errno, f"cannot {verb} {endpoint}: {error.strerror}") from None
        self._poller = zmq.Poller()
        self._poller.register(self._sub, zmq.POLLIN)
        self._replay = ReplaySockets(self._ctx, self._poller, self.config.max_message_bytes)
        return self._bound

    def close(self) -> None:
        if self._connections is not None:
            self._connections.close()
            self._connections = None
        if self._replay is not None:
            self._replay.close()
        if self._sub is not None:
            self._sub.close(linger=0)
        self._sub = self._poller = self._replay = None

    # ------------------------------------------------------------------ polling

    def poll(self, timeout_s: float = 0.0, max_messages: int = 10_000) -> int:
        """Wait up to ``timeout_s`` for messages, process what is there, hand over the batches;
        return the number of vLLM batches (frames) delivered. ``OSError`` if a socket fails."""
        import zmq

        self.open()
        try:
            delivered = self._poll(zmq, timeout_s, max_messages)
            if self._connections is not None:
                self._connections.read()
            return delivered
        except zmq.ZMQError as error:
            raise OSError(error.errno, f"ZMQ: {error.strerror}") from None

    def connection_problem(self) -> str | None:
        """For a tap that connects: what keeps an endpoint from working (never connected,
        refused, not a ZMQ publisher, lost), or ``None`` while all work (or the tap binds)."""
        connections = self._connections
        return None if connections is None else connections.problem()

    def drain(self, timeout_s: float) -> int:
        """Hand over what already reached the sockets, until nothing more arrives for a moment
        or ``timeout_s`` passed; then count, without delivering, the frames still queued on
        the live socket. Returns that count (frames left unread)."""
        import zmq

        if self._sub is None:
            return 0
        try:  # a round at a time, so the deadline holds
            drain_until_quiet(lambda s: self._poller.poll(int(s * 1000)),
                              lambda: self._poll(zmq, 0.0, _ROUND_MESSAGES), timeout_s)
            return count_queued(self._sub, zmq, self.config.receive_hwm)
        except zmq.ZMQError as error:
            raise OSError(error.errno, f"ZMQ: {error.strerror}") from None

    def _poll(self, zmq, timeout_s: float, max_messages: int) -> int:
        delivered = 0
        ready = self._poller.poll(int(timeout_s * 1000))
        while ready and max_messages > 0:
            for sock, _ in ready:
                rank = self._replay.rank_of(sock)
                # read what waits without a poll per message (one costs as much as a small
                # frame's decode), a round at a time, so replay answers never queue behind a
                # flood of live frames
                for _ in range(min(_ROUND_MESSAGES, max_messages)):
                    try:
                        parts = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    max_messages -= 1
                    delivered += self._on_live(parts) if rank is None else self._on_replay(rank, parts)
            ready = self._poller.poll(0)
        self._expire_replays()
        self.flush()
        return delivered

    def _on_live(self, parts: list[bytes]) -> int:
        decoded = self._decode(parts)
        if decoded is None:
            return 0
        key = (decoded.frame.topic, decoded.dp_rank or 0)
        stream = self._stream(key)
        verdict = stream.state.accept_live(decoded.frame.seq,
                                           heal_from_zero=self.config.heal_from_zero)
        if verdict == "restart":
            self._new_incarnation(key, stream)
        elif verdict == "gap":
            self.stats.gaps += 1
        self._ask_replay(key)
        return self._deliver(stream, decoded)

    def _on_replay(self, rank: int, parts: list[bytes]) -> int:
        if parts and parts[0] == b"":
            parts = parts[1:]  # the DEALER sees the ROUTER's empty delimiter
        if len(parts) >= 2 and parts[-2:] == [b"\xff" * 8, b""]:
            self._finish_replays(rank)
            return 0
        decoded = self._decode(parts)
        if decoded is None:
            return 0
        stream = self._streams.get((decoded.frame.topic, decoded.dp_rank or 0))
        if stream is None or not stream.state.accept_replayed(decoded.frame.seq):
            self.stats.replay_duplicates += 1
            self._frame_rows.clear()
            return 0
        self.stats.replayed_batches += 1
        return self._deliver(stream, decoded)

    def _decode(self, parts: list[bytes]) -> _Decoded | None:
        """Split and decode a frame into the frame buffer: the compiled walker, or for a frame
        it leaves alone (or with ``fast_decode`` off) the general decoder."""
        rows = self._frame_rows
        rows.clear()
        try:
            frame = split_frame(parts)
            if frame.seq < 0:
                raise FrameError(f"negative sequence {frame.seq} outside a replay")
            if len(frame.payload) > self.config.max_message_bytes:
                raise FrameError(f"payload of {len(frame.payload)} bytes exceeds "
                                 f"max_bytes={self.config.max_message_bytes}")
            if self.config.fast_decode and rows.add_payload(frame.payload) == self._columns.DECODED:
                return _Decoded(frame, None if rows.dp_rank < 0 else rows.dp_rank)
            batch = decode_payload(frame.payload, max_bytes=self.config.max_message_bytes)
            values, clears, rejected = decoded_columns(batch)
            rows.add_rows(batch.ts_s, *values.values(), clears=clears)
            self.stats.fallback_frames += 1
            return _Decoded(frame, batch.dp_rank, batch.bad_events, rejected)
        except FrameError as exc:
            self.stats.bad_frames += 1
            level = logging.WARNING if self.stats.bad_frames <= 10 else logging.DEBUG
            log.log(level, "vLLM KV-event tap: bad frame skipped (%s); %d so far",
                    exc, self.stats.bad_frames)
            return None

    # ------------------------------------------------------------------ streams

    def _stream(self, key: tuple[bytes, int]) -> _Stream:
        stream = self._streams.get(key)
        if stream is None:
            stream = _Stream(StreamState(), self._source_name(key, 0), self._columns.StreamColumns())
            stored = self._resume(self._stream_prefix(key)) if self._resume is not None else None
            if stored is not None:  # the collector restarted: go on from what it stored
                stream.source, stream.state.last_seq = stored
                self.stats.resumed_streams += 1
            self._streams[key] = stream
        return stream

    def _stream_prefix(self, key: tuple[bytes, int]) -> str:
        topic, rank = key
        return (f"{self.config.engine}-zmq:{self.config.instance}:{topic.decode(errors='replace')}:"
                f"dp{rank}:")

    def _source_name(self, key: tuple[bytes, int], epoch: int) -> str:
        return f"{self._stream_prefix(key)}{int(self._clock() * 1000)}.{epoch}"

    def _new_incarnation(self, key, stream: _Stream) -> None:
        self._flush(stream)  # queued rows belong to the old incarnation's source
        self.stats.restarts += 1
        stream.source = self._source_name(key, stream.state.epoch)
        stream.rows.forget_residency()  # a restarted engine starts with an empty GPU cache
        log.info("vLLM KV-event tap: publisher %s restarted (sequence went back)", key)

    def _ask_replay(self, key: tuple[bytes, int]) -> None:
        stream = self._streams[key]
        if not stream.state.gaps:
            return
        rank = key[1]
        endpoints = dict(self.config.replay_endpoints)
        if rank not in endpoints:
            stream.state.lost += stream.state.missing_count()
            stream.state.gaps.clear()
            return
        start = stream.state.replay_start()
        if start is None:
            return
        self._replay.socket(rank, endpoints[rank]).send_multipart([b"", start.to_bytes(8, "big")])
        stream.state.replay_sent(self._clock())
        self.stats.replay_requests += 1

    def _finish_replays(self, rank: int) -> None:
        for key, stream in self._streams.items():
            if key[1] == rank and stream.state.replay_in_flight:
                stream.state.replay_finished()
                self._ask_replay(key)  # gaps that opened while this replay ran

    def _expire_replays(self) -> None:
        now = self._clock()
        overdue = {key[1] for key, stream in self._streams.items()
                   if stream.state.replay_overdue(now, self.config.replay_timeout_s)}
        for rank in overdue:
            self.stats.replay_timeouts += 1
            self._replay.drop(rank)  # late answers must not end the next replay
            self._finish_replays(rank)
        self.stats.lost_batches = sum(s.state.lost for s in self._streams.values())

    # ------------------------------------------------------------------ delivery

    def _deliver(self, stream: _Stream, decoded: _Decoded) -> int:
        """Move one frame's rows to its stream; without coalescing, hand them over at once.

        Coalescing is safe for idempotency: a stream delivers each publisher sequence at
        most once (replays fill only missing ones), so the largest sequence in a coalesced
        batch names it uniquely within its source.
        """
        stream.rows.absorb(self._frame_rows, self.config.max_tracked_blocks)
        seq = decoded.frame.seq
        stream.pending_seq = seq if stream.pending_seq is None else max(stream.pending_seq, seq)
        if decoded.rejected:
            stream.rejected.update(decoded.rejected)
        self.stats.batches += 1
        self.stats.bad_events += decoded.bad_events
        if (not self.config.coalesce_frames
                or len(stream.rows) >= self.config.max_rows_per_batch):
            self._flush(stream)
        return 1

    def _flush(self, stream: _Stream) -> None:
        if stream.pending_seq is None:
            return
        origin = Origin(self.config.engine, self.config.instance, stream.source)
        columns = stream.rows.take()
        del columns["clears"]  # already expanded into evicts
        nulls = {"parent_hash": columns.pop("parent_null"), "tokens": columns["tokens"] < 0,
                 "tier_from": columns["tier_from"] < 0, "tier_to": columns["tier_to"] < 0}
        batch = EventBatch.from_columns(origin, stream.pending_seq, columns, nulls,
                                        rejected=stream.rejected)
        stream.pending_seq, stream.rejected = None, Rejections()
        self.stats.ingest_batches += 1
        self.stats.block_events += batch.block_events.num_rows
        self.stats.bad_events += sum(batch.rejected.values())
        try:
            self._on_batch(batch)
        except Exception:  # the consumer's bug must not kill the tap
            self.stats.callback_errors += 1
            log.exception("vLLM KV-event tap: on_batch failed for %s seq %d",
                          stream.source, batch.sequence)

    def flush(self) -> None:
        """Hand over every coalesced batch now (``poll`` does this before it returns)."""
        for stream in self._streams.values():
            self._flush(stream)

    def snapshot(self) -> dict:
        """Per-stream progress, for logs and the collector's health output."""
        return {f"{k[0].decode(errors='replace')}/dp{k[1]}": {
                    "source": s.source, "last_seq": s.state.last_seq,
                    "missing": s.state.missing_count(), "lost": s.state.lost}
                for k, s in self._streams.items()}
