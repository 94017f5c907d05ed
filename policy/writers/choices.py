"""What a recommendation chose, before any engine: each writer's ``recommended(choices)``
turns :class:`Choices` into its engine's :class:`EngineSettings` and the notes that say what
its engine cannot express. Adding a writer adds its ``recommended`` there, not a case here."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.policy.writers.trtllm_retention import RetentionClass

GATE = "the learned priority gate"


@dataclass(frozen=True)
class FileTierChoice:
    """The file tier considered for vLLM: ``add`` it or not and why, its size and directory
    (``path`` ``None``: the user gave none, so it cannot be written)."""

    add: bool
    reason: str
    size_bytes: int
    path: str | None


@dataclass(frozen=True)
class Choices:
    """The recommendation's choices.

    * ``cpu_tier_bytes``: the CPU tier beyond the GPU's, ``min_priority`` the learned offload
      threshold over the retention priorities ``classes`` the gateway assigns;
    * ``admission_helps``: the learned gate serves more than admitting every block;
    * ``ranges``/``range_min_priority``: per request class token-range retention and the
      threshold swept over the priorities those ranges give (empty: none);
    * ``vllm_cpu``: the best ``(eviction_policy, store_threshold)`` replayed under vLLM's
      semantics, ``vllm_cpu_bytes`` its CPU tier (``None``: ``cpu_tier_bytes``; larger, as
      vLLM's CPU tier also holds a copy of the GPU's blocks);
    * ``file_tier``: vLLM's file tier decision (``None``: none was considered);
    * ``admission``: the CPU tier's admission rule, chosen with its eviction order on the
      training period (``all``, ``sightings``: a block on its ``min_sightings``-th request, or
      ``learned``: the learned score over its threshold): what each engine takes of it;
    * ``gpu_sightings``: >= 2 when the chosen pair also keeps a new block out of the GPU
      prefix cache until that request (no engine's own setting; the others say so);
      ``vllm_gpu_sightings`` what vLLM gets of it through kvtier's connector, replayed under
      vLLM's semantics beside leaving the GPU unfiltered (0).
    """

    cpu_tier_bytes: int
    min_priority: int | None
    classes: tuple[int, ...] = ()
    admission_helps: bool = False
    ranges: tuple[RetentionClass, ...] = ()
    range_min_priority: int | None = None
    vllm_cpu: tuple[str, int] = ("lru", 0)
    vllm_cpu_bytes: int | None = None
    file_tier: FileTierChoice | None = None
    admission: str = "all"
    min_sightings: int = 0
    gpu_sightings: int = 0
    vllm_gpu_sightings: int = 0

    def gpu_filter_note(self, engine: str) -> tuple[str, ...]:
        """What an engine without kvtier's GPU prefix-cache filter says of it."""
        if not self.gpu_sightings:
            return ()
        return (f"the chosen pair also keeps a new block out of the GPU prefix cache until "
                f"{self.gpu_sightings} requests have referenced it, which {engine} cannot "
                "express (kvtier's vLLM connector applies it to vLLM only): the pair's "
                "validation figures include that part",)
