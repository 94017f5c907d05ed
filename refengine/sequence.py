"""One request inside the engine: its tokens, its block table, and what it cost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class TierTokens:
    """Prompt tokens served per tier; the rest of the prompt is recomputed."""

    gpu: int = 0
    cpu: int = 0
    cold: int = 0


@dataclass
class Sequence:
    """Mutable state of one request. Owned by the engine thread only.

    ``on_token(token_id)`` runs for each generated token and ``on_finish(seq)`` once, both on
    the engine thread; they must not block (the server hands tokens to a queue).
    """

    request_id: str
    prompt: list[int]
    max_tokens: int
    arrival_s: float
    on_token: Callable[[int], None] = lambda token: None
    on_finish: Callable[["Sequence"], None] = lambda seq: None
    output: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_computed: int = 0
    cached_tokens: int = 0
    blocks_registered: int = 0
    served: TierTokens = field(default_factory=TierTokens)
    token_times_s: list[float] = field(default_factory=list)
    tier_config_id: str = ""
    finished: bool = False
    error: str | None = None  # set when the engine gave up on the request

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("prompt must hold at least one token")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    def blocks_needed(self, block_size: int) -> int:
        """Blocks to hold the prompt and every token it may generate."""
        return -(-(self.prompt_len + self.max_tokens) // block_size)

    @property
    def is_done(self) -> bool:
        return len(self.output) >= self.max_tokens
