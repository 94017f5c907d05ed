"""kvtier's guardrail in the collector: the rollback rule
(:mod:`kvtier.policy.rollback.live_rule`) evaluated live, per serving instance, on the request
records the collector ingests.

Every ``step_s`` each instance's rule is evaluated. In ``observe`` mode (the default) a
decision is recorded and exported only; in ``act`` mode it goes to the instance's engines
over the control channel (:class:`kvtier.collector.control_sender.ControlSender`): pause the
newest tier's loads (and its stores, with ``pause_stores``), or resume. Every decision, and
every command an operator sends (:meth:`Guardrail.operate`), is stored as a ``TierMove``
through the collector's own ingest; the moves the engines applied arrive in their batches.

It is one of the collector service's ingest observers
(:class:`kvtier.collector.observers.IngestObserver`: ``observe(batch)`` after each stored
batch, ``samples()`` at each scrape); ``kvtier collect`` starts it with the service's ingest
(:meth:`Guardrail.start`), serves :meth:`Guardrail.routes` beside ``/metrics`` and stops it
before the service.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from kvtier.collector.batch import EventBatch
from kvtier.collector.block_kinds import Tier
from kvtier.collector.columns import empty_table, rows_to_table
from kvtier.collector.control import LinkCosts, tier_config_label
from kvtier.collector.events import BlockEvent, Origin, RequestRecord
from kvtier.collector.moves import TierMove
from kvtier.collector.periodic import Periodic
from kvtier.guardrail.instance import InstanceWatch
from kvtier.policy.rollback.live_rule import Decision, GuardrailSettings

log = logging.getLogger(__name__)
CLIENT_ENGINES = frozenset({"load-probe"})  # a client's view of requests an engine records


@dataclass(frozen=True)
class GuardrailConfig:
    """The rule's settings; the tier it pauses (``None``: each instance's newest, from its
    requests' tier configuration); whether it pauses that tier's stores too; the link costs
    the engines' per-request load-or-recompute prices with in ``act`` mode (``None``: off)."""

    settings: GuardrailSettings
    tier: str | None = None
    pause_stores: bool = False
    costs: LinkCosts | None = None

    def __post_init__(self) -> None:
        if self.tier not in (None, "cpu", "cold"):
            raise ValueError(f"tier must be cpu or cold, got {self.tier!r}")


class Guardrail:
    """The live rule over every instance the collector hears from (see module doc).
    ``sender`` is ``None`` when no control token is configured: nothing can act then."""

    def __init__(self, config: GuardrailConfig, sender=None, *, name: str = "collector",
                 clock: Callable[[], float] = time.time):
        self.config, self.sender, self._clock = config, sender, clock
        self.mode = config.settings.mode
        if self.mode == "act" and sender is None:
            raise ValueError("act mode needs the control channel (a shared token)")
        self._instances: dict[str, InstanceWatch] = {}
        self._lock = threading.Lock()
        self._ingest: Callable[[EventBatch], object] | None = None
        self._sequences: dict[str, int] = {}
        self._epoch = int(clock() * 1000)
        self._name = name
        self._periodic = Periodic(self.evaluate, config.settings.step_s, "kvtier-guardrail")

    # ---------------------------------------------------------------- the service's calls

    def start(self, ingest: Callable[[EventBatch], object]) -> None:
        """Store moves through ``ingest`` and start the evaluations; the channel is bound
        here unless it already is (``OSError`` if it cannot be)."""
        self._ingest = ingest
        if self.sender is not None and not self.sender.bound:
            self.sender.open()
        if self.mode != "off":
            self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop()
        if self.sender is not None:
            self.sender.close()

    def routes(self, token: bytes | None = None) -> dict:
        """``/guardrail``: the state (GET) and an operator's signed command (POST)."""
        from kvtier.guardrail.operator import OperatorDesk

        return {"/guardrail": OperatorDesk(self, token, clock=self._clock)}

    def samples(self):
        from kvtier.guardrail.metrics import guardrail_samples

        return guardrail_samples(self)

    def refresh(self) -> None:
        """Nothing to refresh: the rule runs on its own ``step_s``."""

    def flush(self) -> None:
        """Nothing held back."""

    def export(self, folder) -> None:
        """The moves are in the store, and in its segments."""

    def observe(self, batch: EventBatch) -> None:
        """A stored batch: its request records and the moves its engine applied."""
        origin = batch.origin
        if origin.engine in CLIENT_ENGINES or origin.source.startswith("kvtier-guardrail:"):
            return
        requests = batch.requests.to_pylist() if batch.requests.num_rows else []
        moves = [_move_of(row) for row in batch.tier_moves.to_pylist()] if batch.tier_moves.num_rows else []
        if not requests and not moves:
            return
        with self._lock:
            watch = self._watch(origin.instance, origin.engine)
            watch.observe_requests(requests)
            watch.observe_moves(moves)

    def evaluate(self) -> list[TierMove]:
        """One evaluation instant for every instance; returns the moves it made."""
        now, made = self._clock(), []
        with self._lock:
            for watch in self._instances.values():
                tier = watch.tier(self.config.tier)
                if tier is None:
                    continue
                if self.mode == "act" and watch.instance not in self.sender.states():
                    self._send(watch)  # every act-mode instance hears its state, paused or not
                decision = None if watch.operator else watch.rule.evaluate(now)
                if decision is not None:
                    made.append(self._decided(watch, decision, tier))
        return made

    # ---------------------------------------------------------------- moves

    def _decided(self, watch: InstanceWatch, decision: Decision, tier: str) -> TierMove:
        directions = ("loads", "stores") if self.config.pause_stores else ("loads",)
        paused = frozenset((d, tier) for d in directions) if decision.action == "pause" else frozenset()
        return self._move(watch, "rule", decision.action, paused, decision.reason, decision)

    def _move(self, watch: InstanceWatch, actor: str, action: str, paused: frozenset,
              reason: str, decision: Decision | None = None) -> TierMove:
        changed = sorted(paused ^ watch.commanded) or sorted(paused or watch.commanded)
        watch.commanded = paused
        command = self._send(watch) if self.mode == "act" or actor == "operator" else None
        label = tier_config_label(watch.configured, paused)
        moves = [TierMove(self._clock(), action, direction, Tier[tier.upper()], actor,
                          self.mode if actor == "rule" else None, reason, label,
                          getattr(decision, "ttft_p99_s", None), getattr(decision, "itl_p99_s", None),
                          getattr(decision, "budget_s", None),
                          None if command is None else command.sequence)
                 for direction, tier in changed]
        for move in moves:
            watch.add(move)
        self._store(watch, moves)
        log.info("guardrail: %s %s %s of %s (%s, %s)", actor, action,
                 ",".join(f"{d}:{t}" for d, t in changed), watch.instance, reason,
                 "sent" if command is not None else "recorded only")
        return moves[0]

    def _send(self, watch: InstanceWatch):
        act = self.mode == "act"
        return self.sender.set_state(watch.instance, watch.commanded, act,
                                     self.config.costs if act else None)

    def _store(self, watch: InstanceWatch, moves: list[TierMove]) -> None:
        if self._ingest is None or not moves:
            return
        source = f"kvtier-guardrail:{watch.instance}:{self._epoch}"
        sequence = self._sequences.get(source, 0)
        self._sequences[source] = sequence + 1
        table, _ = rows_to_table(TierMove, moves)
        batch = EventBatch(Origin(watch.engine, watch.instance, source), sequence,
                           empty_table(BlockEvent), empty_table(RequestRecord), tier_moves=table)
        try:
            self._ingest(batch)
        except Exception:  # the store's writer keeps and retries; never stop the rule
            log.exception("guardrail: moves of %s not stored", watch.instance)

    # ---------------------------------------------------------------- operator and readers

    def operate(self, instance: str, action: str, directions: tuple[str, ...],
                tier: str | None) -> TierMove:
        """An operator's pause or resume of ``instance``: sent through the same channel and
        held (the rule waits) until an operator resumes. ``KeyError`` for an unknown
        instance, ``ValueError`` when there is no tier to act on or no channel."""
        if self.sender is None:
            raise ValueError("the collector has no control channel (start it with a token)")
        with self._lock:
            watch = self._instances[instance]
            tier = tier or watch.tier(self.config.tier)
            if tier is None:
                raise ValueError(f"{instance} has no offloading tier in its tier configuration")
            if action == "pause":
                paused = watch.commanded | {(d, tier) for d in directions}
                watch.operator = True
                watch.rule.set_paused(True, self._clock())
            else:
                paused = watch.commanded - {(d, tier) for d in directions}
                watch.operator = bool(paused)
                watch.rule.set_paused(bool(paused), self._clock())
            return self._move(watch, "operator", action, frozenset(paused), "operator")

    def instances(self) -> list[str]:
        with self._lock:
            return sorted(self._instances)

    def status(self) -> dict:
        settings = self.config.settings
        with self._lock:
            instances = [w.status() for w in self._instances.values()]
        return {"mode": self.mode, "channel": None if self.sender is None else self.sender.bound,
                "budget": {"ttft_p99_s": settings.budget.ttft_p99_s,
                           "itl_p99_s": settings.budget.itl_p99_s,
                           "window_s": settings.budget.window_s,
                           "sustained_s": settings.budget.sustained_s},
                "step_s": settings.step_s, "hold_s": settings.hold_s,
                "resume_ratio": settings.resume_ratio, "instances": instances}

    def watches(self) -> list[InstanceWatch]:
        with self._lock:
            return list(self._instances.values())

    def _watch(self, instance: str, engine: str) -> InstanceWatch:
        watch = self._instances.get(instance)
        if watch is None:
            watch = self._instances[instance] = InstanceWatch.new(instance, engine, self.config.settings)
        return watch


def _move_of(row: dict) -> TierMove:
    return TierMove(**{**row, "tier": Tier[str(row["tier"]).upper()]})
