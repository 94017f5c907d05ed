"""The engine's end of the control channel: one daemon thread per engine process reads what
kvtier's collector says (``collector/control.py``) and flips a state the scheduler reads.

Runs inside the engine's process, so it imports only the standard library and pyzmq, and it
never makes the engine wait: the thread owns a SUB socket connected to the collector's
endpoint (loopback by default), reads without blocking the scheduler, and publishes each new
:class:`TierState` by replacing one attribute, which the scheduler reads at a step boundary.

What it drops, counting each by reason into ``rejected`` (the recorder's
``guardrail_rejected``, shipped with every batch): a message above the size limit
(``oversized``), one that does not parse (``malformed``), one whose MAC is not the shared
token's (``unauthorised``), one older than the last accepted or issued too far from this
clock (``stale``), and past ``max_per_s`` messages a second, everything, unread (``rate``).
A wake reads at most four times its share of that rate and the thread then sleeps until the
next one, so a flood costs the engine a bounded share of one thread: what it sends beyond
that waits in ZMQ's queue, and past the queue's bound ZMQ drops it uncounted (the count is a
lower bound). A heartbeat lost in a flood only lets the lease run out. A message for another
instance is ignored.

The lease: the collector repeats its state every heartbeat; with no genuine message for
``lease_s`` the engine returns to its configured tiers (nothing paused, the per-request
load-or-recompute off), because a state nobody watches any more must not outlive its
watcher: the configured tiers are what the operator deployed and what a restart would run.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kvtier.collector.control import (
    DEFAULT_CONTROL_ENDPOINT,
    MAX_MESSAGE_BYTES,
    ControlError,
    LinkCosts,
    check_token,
    decode,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverConfig:
    """Which instance this engine is, the shared token, where the collector's control
    endpoint is, the lease (seconds) and how much reading one wake may do."""

    instance: str
    token: bytes = field(repr=False)
    endpoint: str = DEFAULT_CONTROL_ENDPOINT
    lease_s: float = 30.0
    poll_s: float = 0.05
    max_per_s: int = 200

    def __post_init__(self) -> None:
        check_token(self.token)
        if not isinstance(self.endpoint, str) or "://" not in self.endpoint:
            raise ValueError(f"the control endpoint must be a ZMQ endpoint such as "
                             f"{DEFAULT_CONTROL_ENDPOINT}, got {self.endpoint!r}")
        for name in ("lease_s", "poll_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_per_s < 1:
            raise ValueError(f"max_per_s must be >= 1, got {self.max_per_s!r}")


@dataclass(frozen=True)
class TierState:
    """What the engine runs: the (direction, tier) pairs paused, whether the per-request
    load-or-recompute is on and its costs, the command that set it (its sequence number) and
    why: ``configured`` (from the start), ``command`` or ``lease_expired``."""

    paused: frozenset[tuple[str, str]] = frozenset()
    act: bool = False
    costs: LinkCosts | None = None
    command: int | None = None
    reason: str = "configured"

    @property
    def configured(self) -> bool:
        return not self.paused and not self.act


class ControlReceiver:
    """The thread and its socket (see module doc). ``state`` is what the scheduler reads."""

    def __init__(self, config: ReceiverConfig, rejected: dict[str, int] | None = None, *,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        import zmq

        self.config = config
        self.rejected = {} if rejected is None else rejected
        self.state = TierState()
        self.accepted = 0
        self._clock, self._monotonic = clock, monotonic
        self._zmq = zmq
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.RCVHWM, 1000)
        self._socket.setsockopt(zmq.MAXMSGSIZE, 4 * MAX_MESSAGE_BYTES)  # ZMQ cuts larger ones
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(config.endpoint)
        self._last: tuple[int, int] | None = None  # (epoch, sequence) last accepted
        self._heard_at: float | None = None  # monotonic time of the last accepted message
        self._budget, self._budget_at = float(config.max_per_s), monotonic()
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> "ControlReceiver":
        self._thread = threading.Thread(target=self._run, name="kvtier-control", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._closed:
            try:
                self.poll(self.config.poll_s)
            except Exception:  # never let the thread die: the lease still has to run out
                if self._closed:
                    return
                log.exception("kvtier control: reading failed")
                time.sleep(self.config.poll_s)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Wait up to ``timeout_s`` for messages, handle what the rate allows, then apply the
        lease; returns messages accepted. A wake that read its most waits out ``timeout_s``."""
        accepted = 0
        if self._socket.poll(int(timeout_s * 1000)):
            accepted, full = self._read()
            if full:
                time.sleep(timeout_s)
        self._expire()
        return accepted

    def _read(self) -> tuple[int, bool]:
        accepted = 0
        most = max(4, int(4 * self.config.max_per_s * self.config.poll_s))
        for _ in range(most):
            try:
                frames = self._socket.recv_multipart(self._zmq.NOBLOCK, copy=True)
            except self._zmq.Again:
                return accepted, False
            if not self._take_budget():
                self._count("rate")
                continue
            accepted += self._handle(frames)
        return accepted, True

    def _take_budget(self) -> bool:
        now = self._monotonic()
        rate = self.config.max_per_s
        self._budget = min(float(rate), self._budget + (now - self._budget_at) * rate)
        self._budget_at = now
        if self._budget < 1:
            return False
        self._budget -= 1
        return True

    def _handle(self, frames) -> int:
        try:
            command = decode(frames, self.config.token)
        except ControlError as error:
            self._count(error.reason)
            return 0
        if command.instance != self.config.instance:
            return 0
        if self._last is not None and command.position <= self._last:
            self._count("stale")
            return 0
        if abs(command.issued_s - self._clock()) > self.config.lease_s:
            self._count("stale")
            return 0
        self._last, self._heard_at = command.position, self._monotonic()
        state = TierState(command.paused, command.act, command.costs, command.sequence, "command")
        if (state.paused, state.act, state.costs) != (self.state.paused, self.state.act,
                                                      self.state.costs):
            self.state = state
        self.accepted += 1
        return 1

    def _expire(self) -> None:
        if self.state.configured or self._heard_at is None:
            return
        if self._monotonic() - self._heard_at > self.config.lease_s:
            self.state = TierState(reason="lease_expired")
            log.warning("kvtier control: no word from the collector for %.0f s; back to the "
                        "configured tiers", self.config.lease_s)

    def _count(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def close(self) -> None:
        """Stop the thread and close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._thread.join(1.0)
        self._socket.close(linger=0)
        self._context.term()
