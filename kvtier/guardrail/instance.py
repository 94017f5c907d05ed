"""One serving instance as kvtier's guardrail follows it: its live rule, what it has asked the
engines to run, what the engines report running, the moves and the fallbacks.

Fed from ingested batches (:meth:`InstanceWatch.observe_requests`, ``observe_moves``) and
changed by the rule's decisions and an operator's commands; read by the status page and the
metrics. Owned by :class:`kvtier.guardrail.watch.Guardrail`, which serialises every call.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict, dataclass, field

from kvtier.collector.control import configured_part, newest_tier, paused_part
from kvtier.collector.moves import TierMove
from kvtier.policy.rollback.live_rule import GuardrailSettings, LiveRule

RECENT_MOVES = 200  # moves kept for the status page (the store keeps them all)


@dataclass
class InstanceWatch:
    """The guardrail's view of one instance (see module doc)."""

    instance: str
    engine: str
    rule: LiveRule
    configured: str | None = None  # the engines' configured tier configuration
    engine_config: str | None = None  # the label of the newest request: what the engines ran
    commanded: frozenset = frozenset()  # (direction, tier) the guardrail holds paused
    operator: bool = False  # an operator's command holds the state; the rule waits
    requests: int = 0
    moves: deque = field(default_factory=lambda: deque(maxlen=RECENT_MOVES))
    actions: Counter = field(default_factory=Counter)  # (actor, action, direction, reason, mode)
    fallbacks: Counter = field(default_factory=Counter)  # reason -> requests
    fallback_tokens: Counter = field(default_factory=Counter)  # reason -> tokens

    @classmethod
    def new(cls, instance: str, engine: str, settings: GuardrailSettings) -> "InstanceWatch":
        return cls(instance, engine, LiveRule(settings))

    def observe_requests(self, rows: list[dict]) -> None:
        """Request records (dicts of the schema's fields) as they were stored."""
        for row in sorted(rows, key=lambda r: r["arrival_s"]):
            self.requests += 1
            label = row.get("tier_config_id")
            if label:
                self.configured, self.engine_config = configured_part(label), label
            reason = row.get("fallback_reason")
            if reason:
                self.fallbacks[reason] += 1
                self.fallback_tokens[reason] += row.get("fallback_tokens") or 0
            finished = _finished_s(row)
            if finished is not None:
                self.rule.observe(finished, row.get("ttft_s"), row.get("itl_s"))

    def observe_moves(self, moves: list[TierMove]) -> None:
        """Moves the engines applied (the guardrail's own are added when it makes them)."""
        for move in moves:
            self.add(move)

    def add(self, move: TierMove) -> None:
        self.moves.append(move)
        self.actions[(move.actor, move.action, move.direction, move.reason or "", move.mode or "")] += 1

    def tier(self, override: str | None) -> str | None:
        """The tier the rule pauses: ``override``, else the configured newest tier."""
        return override or (newest_tier(self.configured) if self.configured else None)

    @property
    def engine_paused(self) -> frozenset:
        """What the newest request says its engine had paused."""
        return paused_part(self.engine_config) if self.engine_config else frozenset()

    def status(self) -> dict:
        rule = self.rule.status()
        return {"instance": self.instance, "engine": self.engine, "configured": self.configured,
                "engine_tier_config": self.engine_config,
                "paused": [list(p) for p in sorted(self.commanded)],
                "engine_paused": [list(p) for p in sorted(self.engine_paused)],
                "operator_hold": self.operator, "requests": self.requests,
                "rule": asdict(rule), "fallbacks": dict(self.fallbacks),
                "fallback_tokens": dict(self.fallback_tokens),
                "moves": [_move_dict(m) for m in self.moves]}


def _finished_s(row: dict) -> float | None:
    """When the request's latencies became known: its end (arrival + end-to-end), else its
    first token."""
    arrival = row.get("arrival_s")
    for span in ("e2e_latency_s", "ttft_s"):
        if arrival is not None and row.get(span) is not None:
            return arrival + row[span]
    return None


def _move_dict(move: TierMove) -> dict:
    body = asdict(move)
    body["tier"] = move.tier.label if hasattr(move.tier, "label") else str(move.tier)
    return body
