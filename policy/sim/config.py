"""Typed configuration of a simulated tier stack: sizes, semantics, policy, admission knobs.

Capacities are in blocks of the trace's block size: an int, ``None`` for unlimited, and 0 for
"no such tier" (CPU and cold).

Semantics (how blocks move between tiers; the compiled flows are ``policy/sim/_exclusive.pxi``
and ``policy/sim/_vllm.pxi``, built by ``policy/sim/flows.py``):

* ``"exclusive"`` — a block lives in one tier: a promotion moves it up to the GPU, a GPU
  victim moves down to CPU (if admitted), a CPU victim to the cold tier, a cold victim is
  dropped. Every tier uses ``policy``. This is the classic victim-cache hierarchy. With
  ``gpu_sightings`` >= 2 a block a request computes afresh stays in the GPU tier only from the
  ``gpu_sightings``-th request that references it (counted as the sighting filter counts), as
  an engine that caches a new block in its prefix cache only then: the request holds its slot
  while it runs, then the block leaves the stack (``kvtier evaluate``'s ``sightings-gpu`` row
  prices it; with ``"vllm"`` semantics it is kvtier's vLLM plug-in's prefix-cache filter).
* ``"vllm"`` — vLLM 0.33's OffloadingConnector: the GPU prefix cache is vLLM's block pool
  (``GpuPool`` in ``policy/sim/_vllm.pxi``: LRU free queue, requests released tail first, the last token
  always computed, partial blocks never cached) and its victims are dropped; every newly computed block is offered to the CPU tier as it fills (write-through,
  gated by ``store_threshold``), and so are the GPU hits of a request that loads nothing from
  a lower tier (vLLM offers such a prompt from its first block; ``store_threshold`` counts
  those offers too), and each CPU store cascades to the file (cold) tier, which
  skips existing files; a cold hit is staged through CPU (it takes a CPU slot) before loading
  to the GPU; CPU recency is applied once per request. ``policy`` is the CPU policy
  (vLLM ships ``lru`` and ``arc``). With ``gpu_sightings`` >= 2 a block written into the pool
  (computed or loaded) gets its hash only if it passes the filter; one that does not holds
  its block while the request runs and is then freed to the head of the free queue, as vLLM
  frees every block without a hash.
* ``"trtllm"`` — TensorRT-LLM: priority LRU on GPU and host; a GPU victim is offloaded to
  host memory only if its priority passes ``offload_min_priority`` (``offload_comparison``
  ``"ge"`` as coded, ``"gt"`` as documented), else dropped; host hits move back to the GPU.
  There is no third tier.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.collector.events import PRIORITY_MAX, PRIORITY_MIN
from kvtier.policy.sim.policies import policy_names, policy_spec
from kvtier.policy.sim.policies.admission import COMPARISONS

SEMANTICS = ("exclusive", "vllm", "trtllm")
DEFAULT_PRIORITY = 35  # TensorRT-LLM kDefaultRetentionPriority


@dataclass(frozen=True)
class PriorityRule:
    """The retention priority of a block by its position in the prompt: the first
    ``prefix_blocks`` blocks (e.g. a shared system prompt) get ``prefix_priority``, the rest
    ``default_priority``. The defaults give every block TensorRT-LLM's default, 35."""

    default_priority: int = DEFAULT_PRIORITY
    prefix_blocks: int = 0
    prefix_priority: int = DEFAULT_PRIORITY

    def __post_init__(self) -> None:
        for name in ("default_priority", "prefix_priority"):
            value = getattr(self, name)
            if not PRIORITY_MIN <= value <= PRIORITY_MAX:
                raise ValueError(f"{name} must be in {PRIORITY_MIN}..{PRIORITY_MAX}, got {value}")
        if self.prefix_blocks < 0:
            raise ValueError(f"prefix_blocks must be >= 0, got {self.prefix_blocks}")

    def priority(self, position: int) -> int:
        return self.prefix_priority if position < self.prefix_blocks else self.default_priority


@dataclass(frozen=True)
class SimConfig:
    """One tier stack to replay a trace against. Validated at construction."""

    gpu_blocks: int | None
    cpu_blocks: int | None = 0
    cold_blocks: int | None = 0
    semantics: str = "exclusive"
    policy: str = "lru"
    store_threshold: int = 0
    gpu_sightings: int = 0
    offload_min_priority: int = 30
    offload_comparison: str = "ge"
    priorities: PriorityRule = field(default_factory=PriorityRule)
    default_block_tokens: int = 16

    def __post_init__(self) -> None:
        for name in ("gpu_blocks", "cpu_blocks", "cold_blocks"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ValueError(f"{name} must be an int >= 0 or None (unlimited), got {value!r}")
        _choice("semantics", self.semantics, SEMANTICS)
        _choice("offload_comparison", self.offload_comparison, COMPARISONS)
        # TensorRT-LLM's flow runs its own priority LRU whatever the policy
        allowed = policy_names("vllm" if self.semantics == "vllm" else "exclusive")
        _choice(f"policy (with semantics {self.semantics!r})", self.policy, allowed)
        if self.store_threshold < 0:
            raise ValueError(f"store_threshold must be >= 0, got {self.store_threshold}")
        if self.gpu_sightings < 0 or self.gpu_sightings == 1:
            raise ValueError(f"gpu_sightings must be 0 (cache every block) or >= 2, got "
                             f"{self.gpu_sightings}")
        if self.gpu_sightings and self.semantics == "trtllm":
            raise ValueError("gpu_sightings cannot be combined with semantics 'trtllm' (its "
                             "GPU tier is its own priority LRU)")
        if self.semantics == "vllm" and self.store_threshold >= 2 and self.cold_blocks != 0:
            raise ValueError("store_threshold >= 2 cannot be combined with a cold (file) tier: "
                             "vLLM's TieringOffloadingSpec rejects it")
        if self.semantics == "vllm" and self.cold_blocks != 0 and self.cpu_blocks == 0:
            raise ValueError("a cold (file) tier needs a CPU tier with semantics 'vllm': "
                             "file-tier blocks are staged through CPU")
        if self.semantics == "trtllm" and self.cold_blocks != 0:
            raise ValueError(f"cold_blocks must be 0 with semantics 'trtllm' (it has a GPU and a "
                             f"host tier only), got {self.cold_blocks}")
        if not PRIORITY_MIN <= self.offload_min_priority <= PRIORITY_MAX:
            raise ValueError(f"offload_min_priority must be in {PRIORITY_MIN}..{PRIORITY_MAX}, "
                             f"got {self.offload_min_priority}")
        if self.default_block_tokens <= 0:
            raise ValueError(f"default_block_tokens must be > 0, got {self.default_block_tokens}")

    @property
    def uses_future(self) -> bool:
        """Whether the configured policy needs each block's next use (Belady); a caller's own
        CPU tier declares it itself (``Simulator.uses_future``)."""
        return policy_spec(self.policy).uses_future and self.semantics == "exclusive"


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
