"""What a replay measures: tokens and blocks per outcome, and tier traffic."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class SimResult:
    """Totals of one replay. Token counts are prompt tokens; a block's tokens are the block
    size except for a partial last block. Tokens past the last hashed block (formats that hash
    full blocks only) count as recompute. ``*_stores_total`` count blocks written into a tier,
    ``*_evictions_total`` blocks a tier's policy pushed out, ``drops_total`` blocks that left
    the stack entirely (refused by admission or evicted from the last tier)."""

    requests: int = 0
    prompt_tokens: int = 0
    gpu_hit_tokens: int = 0
    cpu_promotion_tokens: int = 0
    cold_promotion_tokens: int = 0
    recompute_tokens: int = 0
    block_refs: int = 0
    gpu_hit_blocks: int = 0
    cpu_promotion_blocks: int = 0
    cold_promotion_blocks: int = 0
    recompute_blocks: int = 0
    cpu_stores_total: int = 0
    cold_stores_total: int = 0
    gpu_evictions_total: int = 0
    cpu_evictions_total: int = 0
    cold_evictions_total: int = 0
    drops_total: int = 0

    @property
    def hit_tokens(self) -> int:
        return self.gpu_hit_tokens + self.cpu_promotion_tokens + self.cold_promotion_tokens

    @property
    def token_hit_ratio(self) -> float:
        """Prompt tokens served from any tier over all prompt tokens (0 for an empty trace)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_ratio(self) -> float:
        hits = self.gpu_hit_blocks + self.cpu_promotion_blocks + self.cold_promotion_blocks
        return hits / self.block_refs if self.block_refs else 0.0

    def minus(self, before: SimResult) -> SimResult:
        """These totals less ``before`` (a window of one replay)."""
        return SimResult(**{f.name: getattr(self, f.name) - getattr(before, f.name)
                            for f in fields(SimResult)})

    def to_dict(self) -> dict:
        data = asdict(self)
        data["token_hit_ratio"] = self.token_hit_ratio
        data["block_hit_ratio"] = self.block_hit_ratio
        return data
