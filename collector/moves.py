"""The schema's record of tier moves: each pause or resume of a tier's loads or stores in an
engine, by kvtier's guardrail, an operator or the engine's connector. Standard library only:
engines' plug-ins record them. Stored like every record type (``collector/record_types.py``);
the rules are :mod:`kvtier.collector.events`' own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.collector.block_kinds import Tier
from kvtier.collector.events import validate_fields

# What a move did, to which traffic of a tier, who made it, and the guardrail mode a rule's
# decision was made in.
MOVE_ACTIONS = ("pause", "resume")
MOVE_DIRECTIONS = ("loads", "stores")
MOVE_ACTORS = ("rule", "operator", "engine")
GUARDRAIL_MODES = ("observe", "act")
NON_NEGATIVE_MOVE_FIELDS = ("time_s", "ttft_p99_s", "itl_p99_s", "budget_s", "command")


@dataclass(frozen=True, slots=True)
class TierMove:
    """One change of what an engine may do with a tier: ``action`` (:data:`MOVE_ACTIONS`) the
    ``direction`` (:data:`MOVE_DIRECTIONS`: loads from ``tier``, stores into it).

    ``actor`` (:data:`MOVE_ACTORS`): ``rule``, kvtier's guardrail, decided it in ``mode``
    (:data:`GUARDRAIL_MODES`: ``observe`` records it only, ``act`` sends it to the engine);
    ``operator`` asked for it; ``engine``, kvtier's connector applied it (``reason``
    ``command``, or ``lease_expired``: no word from the collector for its lease).
    ``tier_config_id`` is the configuration the engine's requests carry after the move;
    ``ttft_p99_s``/``itl_p99_s`` the window p99s the rule saw, ``budget_s`` the budget the
    breached one was held to; ``command`` the sequence number of the control message.
    """

    time_s: float
    action: str = field(metadata={"choices": MOVE_ACTIONS})
    direction: str = field(metadata={"choices": MOVE_DIRECTIONS})
    tier: Tier
    actor: str = field(metadata={"choices": MOVE_ACTORS})
    mode: str | None = field(default=None, metadata={"choices": GUARDRAIL_MODES})
    reason: str | None = None
    tier_config_id: str | None = None
    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None
    budget_s: float | None = None
    command: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tier, Tier):
            raise ValueError(f"tier must be a Tier, got {self.tier!r}")
        validate_fields(self, NON_NEGATIVE_MOVE_FIELDS)
