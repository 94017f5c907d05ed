"""A request's tier split: its prompt tokens by lookup outcome, as one typed value.

What an engine measured (:meth:`RequestTokens.measured`, from a ``RequestRecord``) and what the
tier replay predicts (the simulator's per-request outcome, :meth:`RequestTokens.of`) travel as
this value between the tier replay, the checks against the engine and the engine model.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.collector.events import RequestRecord


@dataclass(frozen=True, slots=True)
class RequestTokens:
    """Prompt tokens served from the GPU, promoted from the CPU tier, promoted from the cold
    tier, and recomputed (no tier held them)."""

    gpu_hit_tokens: int
    cpu_promotion_tokens: int
    cold_promotion_tokens: int
    recompute_tokens: int

    @classmethod
    def measured(cls, record: RequestRecord) -> RequestTokens:
        """The split ``record``'s engine measured; a tier it did not report served nothing,
        and without ``recomputed_tokens`` the prompt's remainder was recomputed (a trace's
        record, which has no split, recomputes its whole prompt)."""
        gpu, cpu = record.gpu_hit_tokens or 0, record.cpu_promotion_tokens or 0
        cold = record.cold_promotion_tokens or 0
        recomputed = record.recomputed_tokens
        if recomputed is None:
            recomputed = max(record.prompt_tokens - gpu - cpu - cold, 0)
        return cls(gpu, cpu, cold, recomputed)

    @classmethod
    def of(cls, outcome) -> RequestTokens:
        """The split of anything carrying the four token counts by these names (the
        simulator's ``RequestOutcome``)."""
        return cls(int(outcome.gpu_hit_tokens), int(outcome.cpu_promotion_tokens),
                   int(outcome.cold_promotion_tokens), int(outcome.recompute_tokens))

    def counts(self) -> tuple[int, int, int, int]:
        """GPU, CPU, cold and recomputed tokens, in that order."""
        return (self.gpu_hit_tokens, self.cpu_promotion_tokens, self.cold_promotion_tokens,
                self.recompute_tokens)
