"""Engine configuration: model shape, KV block geometry, tier capacities and policy knobs."""

from __future__ import annotations

from dataclasses import dataclass, replace

EVICTION_POLICIES = ("lru", "fifo")
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class TierConfig:
    """The cache dimensions a rollout changes; ``config_id`` names them in request records.

    Capacities are in blocks. ``cpu_blocks=0`` disables the CPU tier, ``cold_blocks=0`` the
    file tier (a file tier needs a CPU tier: promotions stage through CPU).
    ``admission_threshold``: a block evicted from the GPU is stored in the CPU tier only if
    requests used it at least this many times (0 and 1 admit every block; like vLLM's
    ``store_threshold``); others are dropped with a ``DROP`` event. Blocks leaving the CPU tier
    go to the file tier when there is one.
    """

    gpu_blocks: int = 64
    cpu_blocks: int = 0
    cold_blocks: int = 0
    eviction_policy: str = "lru"
    admission_threshold: int = 0
    config_id: str = "gpu-only"

    def __post_init__(self) -> None:
        if not isinstance(self.gpu_blocks, int) or isinstance(self.gpu_blocks, bool) or self.gpu_blocks < 1:
            raise ValueError(f"gpu_blocks must be an int >= 1, got {self.gpu_blocks!r}")
        for name in ("cpu_blocks", "cold_blocks", "admission_threshold"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.cold_blocks and not self.cpu_blocks:
            raise ValueError(f"cold_blocks={self.cold_blocks} needs cpu_blocks >= 1 "
                             "(cold promotions stage through the CPU tier)")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"unknown eviction_policy {self.eviction_policy!r}; "
                             f"allowed: {', '.join(EVICTION_POLICIES)}")
        if not isinstance(self.config_id, str) or not self.config_id:
            raise ValueError(f"config_id must be a non-empty string, got {self.config_id!r}")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs. Defaults make a model small enough for 2 CPU cores."""

    layers: int = 2
    heads: int = 2
    head_dim: int = 16
    vocab_size: int = 512
    max_positions: int = 2048
    block_size_tokens: int = 16
    max_batch_size: int = 8
    dtype: str = "float32"
    seed: int = 0
    tiers: TierConfig = TierConfig()
    file_dir: str | None = None
    file_io_threads: int = 4

    def __post_init__(self) -> None:
        for name in ("layers", "heads", "head_dim", "vocab_size", "max_positions",
                     "block_size_tokens", "max_batch_size", "file_io_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; allowed: {', '.join(DTYPES)}")
        if not isinstance(self.tiers, TierConfig):
            raise ValueError(f"tiers must be a TierConfig, got {type(self.tiers).__name__}")
        if self.tiers.cold_blocks and not self.file_dir:
            raise ValueError(f"cold_blocks={self.tiers.cold_blocks} needs file_dir (a folder for the file tier)")

    @property
    def hidden_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def block_shape(self) -> tuple[int, ...]:
        """One KV block: (layers, K/V, tokens, heads, head_dim)."""
        return (self.layers, 2, self.block_size_tokens, self.heads, self.head_dim)

    @property
    def block_bytes(self) -> int:
        item = 8 if self.dtype == "float64" else 4
        count = 1
        for n in self.block_shape:
            count *= n
        return count * item

    def with_tiers(self, tiers: TierConfig) -> "EngineConfig":
        return replace(self, tiers=tiers)
