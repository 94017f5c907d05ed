"""Per-stream bookkeeping for the vLLM KV-event tap: sequence gaps, replays, restarts.

A *stream* is one publisher as the tap sees it, keyed by ``(topic, dp_rank)``: vLLM runs one
publisher per data-parallel rank, and a collector that binds one socket for many engines
tells them apart by topic. Pure logic, no sockets: the tap feeds it sequence numbers and
acts on what it answers, so every rule here is testable without ZMQ.

Rules:

* the next live sequence number is ``last + 1``; a larger one opens a *gap* (a range of
  missing sequences) that the tap asks the replay socket for;
* a smaller one means the publisher restarted (vLLM's ``seq`` restarts at 0 and carries no
  epoch): the stream gets a new epoch, open gaps of the old epoch are lost, and a restart
  that lands past 0 opens a gap from 0;
* a replayed sequence is delivered only if it is still missing (live and replayed copies
  are both possible; ingest is idempotent anyway);
* when a replay ends (end marker or timeout), the ranges it covered that did not arrive
  are lost: the publisher's buffer no longer had them.

GPU residency (which blocks a stream's GPU holds, so that ``AllBlocksCleared`` becomes one
evict per resident block, in hash order) is kept with the stream's rows, in compiled code:
``probes/vllm/wire_columns.pyx``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GapRange:
    """Missing sequences ``start`` (inclusive) to ``end`` (exclusive)."""

    start: int
    end: int
    requested: bool = False

    def __len__(self) -> int:
        return self.end - self.start


@dataclass
class StreamState:
    """One publisher incarnation's progress. ``epoch`` counts restarts seen by this tap."""

    epoch: int = 0
    last_seq: int | None = None
    gaps: list[GapRange] = field(default_factory=list)
    replay_in_flight: bool = False
    replay_started_s: float | None = None
    lost: int = 0

    # ---- live frames

    def classify_live(self, seq: int) -> str:
        """``"first"``, ``"next"``, ``"gap"`` or ``"restart"`` for a live sequence number."""
        if self.last_seq is None:
            return "first"
        if seq == self.last_seq + 1:
            return "next"
        if seq > self.last_seq + 1:
            return "gap"
        return "restart"

    def accept_live(self, seq: int, *, heal_from_zero: bool = False) -> str:
        """Record a live sequence number and return how it was classified."""
        verdict = self.classify_live(seq)
        if verdict == "restart":
            self.lost += self.missing_count()
            self.gaps.clear()
            self.epoch += 1
            self.last_seq = None
            self.replay_in_flight = False
            if seq > 0:
                self.gaps.append(GapRange(0, seq))
        elif verdict == "gap":
            self.gaps.append(GapRange(self.last_seq + 1, seq))
        elif verdict == "first" and heal_from_zero and seq > 0:
            self.gaps.append(GapRange(0, seq))
        self.last_seq = seq
        return verdict

    # ---- replays

    def replay_start(self) -> int | None:
        """The sequence to ask the replay socket for, or ``None`` if nothing is to ask now.

        Marks the unrequested gaps as requested; call :meth:`replay_sent` after sending.
        """
        if self.replay_in_flight:
            return None
        pending = [g for g in self.gaps if not g.requested]
        if not pending:
            return None
        for gap in pending:
            gap.requested = True
        return min(g.start for g in pending)

    def replay_sent(self, now_s: float) -> None:
        self.replay_in_flight = True
        self.replay_started_s = now_s

    def accept_replayed(self, seq: int) -> bool:
        """True if ``seq`` was missing (it is now filled); False for a duplicate."""
        for i, gap in enumerate(self.gaps):
            if gap.start <= seq < gap.end:
                self._split(i, seq)
                return True
        return False

    def _split(self, index: int, seq: int) -> None:
        gap = self.gaps.pop(index)
        parts = [GapRange(gap.start, seq, gap.requested), GapRange(seq + 1, gap.end, gap.requested)]
        self.gaps[index:index] = [p for p in parts if len(p) > 0]

    def replay_finished(self) -> int:
        """End of a replay: requested ranges still missing are lost. Returns how many."""
        lost = sum(len(g) for g in self.gaps if g.requested)
        self.gaps = [g for g in self.gaps if not g.requested]
        self.lost += lost
        self.replay_in_flight = False
        self.replay_started_s = None
        return lost

    def replay_overdue(self, now_s: float, timeout_s: float) -> bool:
        return (self.replay_in_flight and self.replay_started_s is not None
                and now_s - self.replay_started_s >= timeout_s)

    def missing_count(self) -> int:
        return sum(len(g) for g in self.gaps)
