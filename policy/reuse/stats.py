"""What the reuse pass gathers: per distinct block and per reuse (see :func:`kvtier.policy.reuse.collect.collect`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.policy.reuse.histogram import LogHistogram

ALL = "all"


@dataclass(slots=True)
class BlockStats:
    refs: int
    depth: int
    parent: int | None
    tokens: int
    first_s: float
    last_s: float
    request_type: str


@dataclass
class ReuseStats:
    """Totals of one pass (see the module docstring). Built by :func:`kvtier.policy.reuse.collect.collect`."""

    blocks: dict[int, BlockStats] = field(default_factory=dict)
    requests: int = 0
    prompt_tokens: int = 0
    block_refs: int = 0
    ideal_hit_tokens: int = 0
    first_s: float | None = None
    last_s: float | None = None
    since_creation: dict[str, LogHistogram] = field(default_factory=dict)
    since_last_use: dict[str, LogHistogram] = field(default_factory=dict)
    since_last_use_by_turn: dict[str, LogHistogram] = field(default_factory=dict)
    ideal_hit_tokens_per_request: list[int] = field(default_factory=list)
    has_measured_gpu_hits: bool = False
    block_tokens: int | None = None

    @property
    def duration_s(self) -> float:
        if self.first_s is None:
            return 0.0
        return self.last_s - self.first_s

    @property
    def ideal_token_hit_ratio(self) -> float:
        return self.ideal_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


TURN_BUCKETS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, None))


def turn_bucket(turn: int | None) -> str | None:
    """``"1"``, ``"2"``, ``"3-5"``, ``"6-10"``, ``"11+"``; ``None`` when the trace has no turns."""
    if turn is None:
        return None
    for low, high in TURN_BUCKETS:
        if turn >= low and (high is None or turn <= high):
            return f"{low}+" if high is None else (str(low) if low == high else f"{low}-{high}")
    return "0"
