"""The tap against vLLM's own ``ZmqEventPublisher`` (official vllm==0.33.0 wheel, run in a
side environment so vLLM never enters the project's dependencies).

The side environment is found through ``KVTIER_VLLM_PYTHON`` or at
``/tmp/kvt-vllm-side/bin/python`` (tests/probes/vllm/side_env.sh builds it); without it
these tests skip. vLLM's publisher connects to the tap's bound socket (non-wildcard
endpoint), which makes ZMQ's slow-joiner loss real: the tap heals it from vLLM's replay
socket (``heal_from_zero``), which is the behaviour under test.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from kvtier.probes.vllm.tap import VllmEventTap, VllmTapConfig
from tests.conftest import free_port

SIDE_PYTHON = os.environ.get("KVTIER_VLLM_PYTHON", "/tmp/kvt-vllm-side/bin/python")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not Path(SIDE_PYTHON).exists(), reason="no vLLM side environment"),
]


class Side:
    """The side process, one command per line."""

    def __init__(self):
        script = Path(__file__).with_name("side_publisher.py")
        self.proc = subprocess.Popen([SIDE_PYTHON, str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def __call__(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"side publisher: {line!r} -> {answer!r}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def side():
    proc = Side()
    yield proc
    proc.close()


class DroppingTap(VllmEventTap):
    """Loses chosen live frames, as a congested network would."""

    drop: set = set()

    def _on_live(self, parts):
        if int.from_bytes(parts[1], "big") in self.drop:
            self.drop.discard(int.from_bytes(parts[1], "big"))
            return 0
        return super()._on_live(parts)


def restart(side, line: str, rounds: int = 50) -> None:
    """Start again on the same ports; ZMQ releases a closed socket's port asynchronously."""
    for _ in range(rounds):
        try:
            return side(line)
        except RuntimeError as exc:
            if "Address already in use" not in str(exc):
                raise
            time.sleep(0.1)
    raise AssertionError("the replay port was never released")


def pump(tap, side, done, rounds=60):
    """Publish one batch per round until ``done()``; batch n carries hashes 100+n and 200+n."""
    for n in range(rounds):
        if done():
            return
        side(f"publish {100 + n},{200 + n}")
        tap.poll(0.2)
    raise AssertionError("the tap did not deliver what was published")


def sequences(batches, source):
    return {b.sequence for b in batches if b.origin.source == source}


def test_real_vllm_publisher_gap_replay_and_restart(side):
    batches = []
    replay = f"tcp://127.0.0.1:{free_port()}"  # vLLM's publisher binds it, on the port it is given
    tap = DroppingTap(VllmTapConfig(endpoints=("tcp://127.0.0.1:0",), bind=True,
                                    replay_endpoints=((0, replay),), topic="kv",
                                    heal_from_zero=True, instance="real"), batches.append)
    (endpoint,) = tap.open()
    try:
        side(f"start {endpoint} {replay} kv")
        # 1. slow-joiner losses and one frame lost mid-stream, healed from vLLM's replay socket
        tap.drop = {3}
        pump(tap, side, lambda: batches and sequences(batches, batches[0].origin.source)
             >= set(range(6)))
        first = batches[0].origin.source
        assert {b.origin.source for b in batches} == {first}
        assert tap.stats.gaps + (batches[0].sequence > 0) >= 1
        assert tap.stats.replayed_batches >= 1
        assert tap.stats.bad_frames == 0 and tap.stats.lost_batches == 0
        assert tap.stats.fallback_frames == 0  # vLLM's own encoding takes the compiled walker
        rows = [r for b in batches if b.sequence == 3 for r in b.block_events.to_pylist()]
        assert [(r["kind"], r["block_hash"], r["tier_to"]) for r in rows] == [
            ("store", 103, "gpu"), ("store", 203, "gpu"), ("store", 103, "cpu"),
            ("evict", 203, None)]
        # 2. the publisher restarts: its sequence goes back to 0, under a new source
        side("stop")
        restart(side, f"start {endpoint} {replay} kv")
        later = lambda: [b for b in batches if b.origin.source != first]
        pump(tap, side, lambda: later() and sequences(later(), later()[0].origin.source)
             >= {0, 1, 2})
        assert tap.stats.restarts == 1
        assert len({b.origin.source for b in later()}) == 1
    finally:
        try:
            side("stop")
        except RuntimeError:
            pass  # it was already stopped
        tap.close()


def test_real_vllm_publishers_for_two_dp_ranks(side):
    from tests.probes.vllm.dp_endpoints import for_data_parallel

    base, replay_base = free_port(), free_port()  # vLLM adds each rank to the ports it is given
    batches = []
    tap = VllmEventTap(for_data_parallel(f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{replay_base}",
                                         2, bind=True, topic="kv", heal_from_zero=True,
                                         instance="dp"), batches.append)
    tap.open()
    try:
        for rank in (0, 1):  # vLLM adds the rank to both ports itself
            side(f"start tcp://127.0.0.1:{base} tcp://127.0.0.1:{replay_base} kv {rank}")
        by_rank = lambda r: {b.sequence for b in batches if b.origin.source.split(":")[3] == f"dp{r}"}
        for n in range(60):
            if by_rank(0) >= {0, 1, 2} and by_rank(1) >= {0, 1, 2}:
                break
            side(f"publish {300 + n} 0")
            side(f"publish {400 + n} 1")
            tap.poll(0.2)
        assert by_rank(0) >= {0, 1, 2} and by_rank(1) >= {0, 1, 2}
        assert len({b.origin.source for b in batches}) == 2
        assert tap.stats.restarts == 0 and tap.stats.lost_batches == 0
        rank1 = {r["block_hash"] for b in batches if ":dp1:" in b.origin.source
                 for r in b.block_events.to_pylist()}
        assert rank1 and all(400 <= h < 500 for h in rank1)
    finally:
        for rank in (0, 1):
            try:
                side(f"stop {rank}")
            except RuntimeError:
                pass
        tap.close()
