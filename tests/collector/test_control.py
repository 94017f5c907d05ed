"""The control channel between the collector and an engine's connector: its signed messages,
the engine's receiver (what it accepts, what it drops and counts, its lease) and the
collector's sender, over real ZMQ sockets on loopback."""

from __future__ import annotations

import time

import pytest
import zmq

from kvtier.collector.control import (
    Command,
    ControlError,
    LinkCosts,
    configured_part,
    decode,
    encode,
    newest_tier,
    paused_part,
    tier_config_label,
)
from kvtier.collector.control_receiver import ControlReceiver, ReceiverConfig
from kvtier.collector.control_sender import ControlSender
from tests.conftest import FixedClock, free_port

TOKEN = b"a-shared-token-of-32-bytes-here!"
PAUSE_CPU_LOADS = frozenset({("loads", "cpu")})


def command(sequence=1, *, instance="node-1", issued_s=1_800_000_000.0, epoch=7, **kw):
    return Command(instance, epoch, sequence, issued_s, **kw)


def test_a_signed_message_round_trips_and_anything_else_is_dropped_with_its_reason():
    sent = command(paused=PAUSE_CPU_LOADS, act=True, costs=LinkCosts(1e-4, 1e-9, 2e-5))
    frames = encode(sent, TOKEN)
    assert decode(frames, TOKEN) == sent
    assert TOKEN not in b"".join(frames)  # the token never travels

    def reason(frames):
        with pytest.raises(ControlError) as dropped:
            decode(frames, TOKEN)
        return dropped.value.reason

    assert reason(encode(sent, b"another-token-of-32-bytes-here!!")) == "unauthorised"
    assert reason([frames[0].replace(b"cpu", b"gpu"), frames[1]]) == "unauthorised"  # tampered
    assert reason([frames[0]]) == "malformed"
    assert reason([b"x" * 5000, frames[1]]) == "oversized"
    import hashlib
    import hmac

    def signed(body: bytes):
        return [body, hmac.new(TOKEN, body, hashlib.sha256).digest()]

    assert reason(signed(b"not json")) == "malformed"
    assert reason(signed(b'{"format": "kvtier.control/1", "instance": "n", "epoch": 1, '
                         b'"sequence": 1, "issued_s": 1.0, "paused": [["loads", "gpu"]]}')) == "malformed"


def test_a_short_token_is_refused():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ReceiverConfig("node-1", b"short")


def test_tier_configuration_labels_say_what_is_paused():
    label = tier_config_label("gpu+cpu:8388608", {("stores", "cpu"), ("loads", "cpu")})
    assert label == "gpu+cpu:8388608;paused=loads:cpu,stores:cpu"
    assert configured_part(label) == "gpu+cpu:8388608"
    assert paused_part(label) == {("loads", "cpu"), ("stores", "cpu")}
    assert tier_config_label("gpu+cpu:1", frozenset()) == "gpu+cpu:1"
    assert paused_part("gpu+cpu:1") == frozenset()
    assert [newest_tier(c) for c in ("gpu+cpu:1", "gpu+cpu+file:1;paused=loads:cold", "gpu", "x")] \
        == ["cpu", "cold", None, None]


class Engine:
    """A receiver as an engine runs it, on a hand-moved lease clock."""

    def __init__(self, endpoint, lease_s=5.0, **kw):
        self.now = FixedClock(1000.0)
        self.receiver = ControlReceiver(ReceiverConfig("node-1", TOKEN, endpoint, lease_s, **kw),
                                        monotonic=self.now)

    def poll_until(self, predicate, timeout_s=5.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.receiver.poll(0.05)
            if predicate():
                return True
        return False


@pytest.fixture
def endpoint():
    return f"tcp://127.0.0.1:{free_port()}"


def test_the_engine_takes_the_collectors_state_and_returns_to_its_tiers_when_the_lease_ends(endpoint):
    sender = ControlSender(TOKEN, endpoint, heartbeat_s=0.05)
    sender.open()
    engine = Engine(endpoint)
    try:
        sender.set_state("node-1", PAUSE_CPU_LOADS)
        sender.set_state("node-2", frozenset({("stores", "cpu")}))  # another instance's
        assert engine.poll_until(lambda: engine.receiver.state.paused == PAUSE_CPU_LOADS)
        assert engine.receiver.state.reason == "command"
        engine.now.advance(4.0)  # heartbeats renew the lease
        assert engine.poll_until(lambda: engine.receiver.accepted > 3)
        assert engine.receiver.state.paused == PAUSE_CPU_LOADS
        sender.close()  # the collector is gone
        engine.now.advance(5.5)
        engine.receiver.poll(0.1)
        assert engine.receiver.state.paused == frozenset()
        assert engine.receiver.state.reason == "lease_expired"
        assert engine.receiver.rejected == {}
    finally:
        sender.close()
        engine.receiver.close()


def test_garbage_wrong_tokens_replays_and_floods_change_nothing_and_are_counted(endpoint):
    context = zmq.Context()
    hostile = context.socket(zmq.PUB)  # whoever holds the collector's endpoint
    hostile.bind(endpoint)
    engine = Engine(endpoint, max_per_s=100)
    try:
        genuine = encode(command(1, issued_s=time.time(), paused=PAUSE_CPU_LOADS), TOKEN)
        while not engine.poll_until(lambda: engine.receiver.accepted == 1, 0.2):
            hostile.send_multipart(genuine)  # the subscription takes a moment to arrive
        baseline, before = engine.receiver.state, dict(engine.receiver.rejected)
        forged = encode(command(99, issued_s=time.time()), b"guessed-token-guessed-token-1234")
        old = encode(command(2, issued_s=time.time() - 3600, paused=frozenset()), TOKEN)
        for frames in ([b"\x00garbage"], [b"{}", b"mac"], forged, genuine, old):
            hostile.send_multipart(frames)
        engine.poll_until(lambda: sum(engine.receiver.rejected.values()) >= sum(before.values()) + 5, 2.0)
        counted = {k: v - before.get(k, 0) for k, v in engine.receiver.rejected.items()}
        # a MAC is checked before anything is parsed: two frames of junk are unauthorised
        assert counted == {"malformed": 1, "unauthorised": 2, "stale": 2}
        for _ in range(2000):  # a flood, far past the rate a second allows
            hostile.send_multipart(forged)
        engine.poll_until(lambda: engine.receiver.rejected.get("rate", 0) > 0, 3.0)
        engine.poll_until(lambda: False, 0.5)  # read what is left
        assert engine.receiver.state == baseline  # nothing changed
        flood = (engine.receiver.rejected["rate"] + engine.receiver.rejected["unauthorised"]
                 - before.get("unauthorised", 0) - 2)
        assert engine.receiver.rejected["rate"] > 0 and 0 < flood <= 2000
    finally:
        hostile.close(linger=0)
        context.term()
        engine.receiver.close()
