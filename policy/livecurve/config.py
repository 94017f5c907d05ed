"""What the collector's live curves compute: the ladders, the windows, each instance's GPU.

Sizes are in tokens (as ``--gpu-tokens``/``--cpu-tokens`` everywhere else); an instance's
blocks are its requests' ``block_size_tokens``. Bytes come from the KV bytes per token its
block events carry, else ``kv_bytes_per_token`` (given), else the default model's geometry
(and the curve says which).
"""

from __future__ import annotations

from dataclasses import dataclass

# Which tier semantics an engine's tiers follow (see the kernel, ``_recency.pyx``): vLLM's CPU
# tier keeps a copy of what it stores; every other engine's tiers are exclusive (kvtier's
# reference engine, SGLang HiCache, LMCache, Dynamo KVBM; TensorRT-LLM with every priority
# offloaded).
SEMANTICS_BY_ENGINE = {"vllm": "vllm"}
SEMANTICS = ("exclusive", "vllm")
DEFAULT_CPU_LADDER_TOKENS = (0, 1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 20, 1 << 21, 1 << 22)
REACHABLE_PERCENTS = (80, 90, 95, 99)
BINS_PER_OCTAVE = 16  # the resolution of the capacities for a share of the reachable hits


def semantics_of(engine: str) -> str:
    return SEMANTICS_BY_ENGINE.get(engine, "exclusive")


@dataclass(frozen=True)
class CurveConfig:
    """Validated at construction.

    * ``cpu_ladder_tokens``: CPU-tier sizes to report the hit ratio at (0: the GPU alone);
    * ``cold_ladder_tokens``: file (cold) tier sizes, each under a CPU tier of
      ``cold_above_cpu_tokens`` (vLLM's file tier needs a CPU tier to stage through);
    * ``gpu_tokens``: every instance's GPU prefix cache, unless ``gpu_tokens_by_instance``
      names it or the engine publishes it (vLLM's ``cache_config_info``, when scraped);
    * ``windows_s``: sliding windows (each also summed since start, as ``all``), counted in
      buckets of ``bucket_s`` of the collector's clock;
    * ``reorder_s``: requests reach the collector as they finish; they are replayed in
      arrival order once the instance's newest arrival is this much later (or it is quiet);
    * ``ttft_budget_s``: the p99 TTFT the headroom signal keeps (``None``: no headroom).
    """

    cpu_ladder_tokens: tuple[int, ...] = DEFAULT_CPU_LADDER_TOKENS
    cold_ladder_tokens: tuple[int, ...] = ()
    cold_above_cpu_tokens: int = 0
    gpu_tokens: int | None = None
    gpu_tokens_by_instance: tuple[tuple[str, int], ...] = ()
    kv_bytes_per_token: int | None = None
    windows_s: tuple[float, ...] = (300.0, 3600.0)
    bucket_s: float = 30.0
    reorder_s: float = 10.0
    ttft_budget_s: float | None = None
    headroom_requests: int = 2000  # the latest requests the headroom replays

    def __post_init__(self) -> None:
        for name in ("cpu_ladder_tokens", "cold_ladder_tokens"):
            ladder = getattr(self, name)
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in ladder):
                raise ValueError(f"{name} must hold ints >= 0, got {ladder!r}")
            object.__setattr__(self, name, tuple(sorted(set(ladder))))
        if not self.cpu_ladder_tokens:
            raise ValueError("cpu_ladder_tokens needs at least one size")
        if self.cold_ladder_tokens and not self.cold_above_cpu_tokens > 0:
            raise ValueError("a cold ladder needs cold_above_cpu_tokens > 0: the CPU tier it sits "
                             f"under, got {self.cold_above_cpu_tokens!r}")
        if 0 in self.cold_ladder_tokens:
            raise ValueError("cold_ladder_tokens must be > 0 (no file tier is the CPU ladder)")
        for name in ("gpu_tokens", "kv_bytes_per_token"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
        for instance, tokens in self.gpu_tokens_by_instance:
            if not instance or not isinstance(tokens, int) or tokens < 0:
                raise ValueError(f"gpu_tokens_by_instance: need (name, tokens >= 0), got "
                                 f"({instance!r}, {tokens!r})")
        if not self.windows_s or any(not w > 0 for w in self.windows_s):
            raise ValueError(f"windows_s must hold seconds > 0, got {self.windows_s!r}")
        if not self.bucket_s > 0 or any(w < self.bucket_s for w in self.windows_s):
            raise ValueError(f"bucket_s must be > 0 and at most the shortest window, got "
                             f"{self.bucket_s!r}")
        if not self.reorder_s >= 0:
            raise ValueError(f"reorder_s must be >= 0, got {self.reorder_s!r}")
        if self.ttft_budget_s is not None and not self.ttft_budget_s > 0:
            raise ValueError(f"ttft_budget_s must be > 0 or None, got {self.ttft_budget_s!r}")
        if self.headroom_requests < 10:
            raise ValueError(f"headroom_requests must be >= 10, got {self.headroom_requests!r}")

    def gpu_tokens_of(self, instance: str) -> int | None:
        """The GPU size given for ``instance`` (its own, else everyone's), ``None`` if none."""
        return dict(self.gpu_tokens_by_instance).get(instance, self.gpu_tokens)

    @property
    def track_tokens(self) -> int:
        """The largest CPU (or CPU plus file) size asked: the stacks hold that much."""
        return max(self.cpu_ladder_tokens[-1],
                   self.cold_above_cpu_tokens + max(self.cold_ladder_tokens, default=0), 1)
