"""What a config writer takes: engine-neutral tier settings, and the guardrails to check.

:class:`EngineSettings` is the contract between the recommendation and the
writers: every field is optional (``None`` = leave the engine's current value alone), units
are in the names, and generic ranges are checked at construction. Each writer maps the
fields onto its engine's own knobs and refuses values its engine cannot express.

JSON form (what ``kvtier recommend`` writes and ``kvtier push --recommendation`` reads):
``{"settings": {"cpu_tier_bytes": 10737418240, "eviction_policy": "arc", ...},
"guardrails": {"host_headroom_bytes": 68719476736}}``; a bare settings object is accepted
too. Unknown keys are refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from kvtier.policy.writers.trtllm_retention import RetentionClass, parse_classes

PRIORITY_MIN, PRIORITY_MAX = 0, 100
EVICTION_POLICIES = ("lru", "arc", "lfu", "fifo", "slru", "priority")
WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")


@dataclass(frozen=True)
class EngineSettings:
    """Tier settings for one serving instance.

    * ``cpu_tier_bytes``: host DRAM tier, total for the instance (all ranks together);
      0 turns the CPU tier off.
    * ``cold_tier_bytes`` / ``cold_tier_path``: the file tier's size and directory.
    * ``eviction_policy``: one of ``EVICTION_POLICIES`` (each engine supports a subset).
    * ``store_threshold``: store a block in the CPU tier only after it was offered this
      many times (vLLM semantics: 0 = always, else >= 2).
    * ``gpu_sightings``: keep a new block in the GPU prefix cache only from the request that
      references it this many times (0 = every block, else >= 2): vLLM with kvtier's
      connector (``kvtier_gpu_sightings``).
    * ``offload_min_priority``: offload to host only blocks whose retention priority is
      >= this (0..100; TensorRT-LLM, Dynamo KVBM).
    * ``retention_priorities``: the retention priorities the gateway assigns to request
      classes (0..100), so a threshold can be placed between them.
    * ``retention_classes``: request class name -> retention priority (0..100), for the
      gateway's per-class ``KvCacheRetentionConfig`` (TensorRT-LLM); JSON form is an object.
    * ``retention_ranges``: per request class, a priority per prompt token range and one
      for decoded tokens (:class:`kvtier.policy.writers.trtllm_retention.RetentionClass`, TensorRT-LLM's
      ``KvCacheRetentionConfig``); JSON form ``{class: {"token_range_retention_configs":
      [...], "decode_retention_priority": p, "decode_duration_ms": null}}``.
    * ``save_priority_limit``: LMCache ``priority_limit`` (skip saving requests whose
      priority value is above it).
    * ``block_size_tokens``: tokens per KV block / offload chunk.
    * ``write_policy``: SGLang HiCache write policy (one of ``WRITE_POLICIES``).
    * ``kv_events``: turn the engine's KV-event stream on (so kvtier can observe it).
    * ``ranks``: tensor-parallel ranks sharing ``cpu_tier_bytes`` (engines sized per rank).
    """

    cpu_tier_bytes: int | None = None
    cold_tier_bytes: int | None = None
    cold_tier_path: str | None = None
    eviction_policy: str | None = None
    store_threshold: int | None = None
    gpu_sightings: int | None = None
    offload_min_priority: int | None = None
    retention_priorities: tuple[int, ...] = ()
    retention_classes: tuple[tuple[str, int], ...] = ()
    retention_ranges: tuple[RetentionClass, ...] = ()
    save_priority_limit: int | None = None
    block_size_tokens: int | None = None
    write_policy: str | None = None
    kv_events: bool | None = None
    ranks: int = 1

    def __post_init__(self) -> None:
        for name in ("cpu_tier_bytes", "cold_tier_bytes"):
            _check_int(name, getattr(self, name), minimum=0)
        _check_int("block_size_tokens", getattr(self, "block_size_tokens"), minimum=1)
        _check_int("ranks", self.ranks, minimum=1)
        _check_int("store_threshold", self.store_threshold, minimum=0)
        if self.store_threshold == 1:
            raise ValueError("store_threshold must be 0 (store always) or >= 2, got 1")
        _check_int("gpu_sightings", self.gpu_sightings, minimum=0)
        if self.gpu_sightings == 1:
            raise ValueError("gpu_sightings must be 0 (cache every block) or >= 2, got 1")
        for name in ("offload_min_priority", "save_priority_limit"):
            _check_priority(name, getattr(self, name))
        object.__setattr__(self, "retention_priorities", tuple(self.retention_priorities))
        for value in self.retention_priorities:
            _check_priority("retention_priorities", value)
        classes = self.retention_classes
        pairs = tuple(sorted(classes.items())) if isinstance(classes, Mapping) else tuple(classes)
        object.__setattr__(self, "retention_classes", pairs)
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                    and pair[0]):
                raise ValueError(f"retention_classes must map class names to priorities, got {pair!r}")
            _check_priority(f"retention_classes[{pair[0]!r}]", pair[1])
        object.__setattr__(self, "retention_ranges", parse_classes(self.retention_ranges))
        both = {name for name, _ in pairs} & {c.name for c in self.retention_ranges}
        if both:
            raise ValueError(f"request class(es) {', '.join(sorted(both))} are in both "
                             "retention_classes and retention_ranges; keep one")
        _check_choice("eviction_policy", self.eviction_policy, EVICTION_POLICIES)
        _check_choice("write_policy", self.write_policy, WRITE_POLICIES)
        if self.kv_events is not None and not isinstance(self.kv_events, bool):
            raise ValueError(f"kv_events must be true or false, got {self.kv_events!r}")
        if self.cold_tier_path is not None and (not isinstance(self.cold_tier_path, str)
                                                or not self.cold_tier_path.startswith("/")):
            raise ValueError(f"cold_tier_path must be an absolute path, got {self.cold_tier_path!r}")
        if self.cold_tier_bytes and self.cold_tier_path is None:
            raise ValueError("cold_tier_bytes > 0 needs cold_tier_path")

    @classmethod
    def from_mapping(cls, data: Mapping) -> "EngineSettings":
        """From a JSON object; unknown keys raise ``ValueError`` naming them and the known ones."""
        if not isinstance(data, Mapping):
            raise ValueError(f"settings must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values = dict(data)
        if "retention_priorities" in values:
            if not isinstance(values["retention_priorities"], (list, tuple)):
                raise ValueError("retention_priorities must be a list of 0..100 ints")
            values["retention_priorities"] = tuple(values["retention_priorities"])
        return cls(**values)

    @property
    def priorities_in_use(self) -> tuple[int, ...]:
        """Every retention priority the settings mention (classes and bare priorities)."""
        ranged = {p for c in self.retention_ranges for p in c.priorities}
        return tuple(sorted(set(self.retention_priorities) | ranged
                            | {p for _, p in self.retention_classes}))


@dataclass(frozen=True)
class Guardrails:
    """Measured limits a push must respect. ``host_headroom_bytes``: host DRAM that can be
    given to the CPU tier without starving the node (from ``kvtier probe headroom``)."""

    host_headroom_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_int("host_headroom_bytes", self.host_headroom_bytes, minimum=0)

    def violations(self, settings: EngineSettings) -> list[str]:
        """Why ``settings`` must not be pushed (empty if it may)."""
        out = []
        if (self.host_headroom_bytes is not None and settings.cpu_tier_bytes is not None
                and settings.cpu_tier_bytes > self.host_headroom_bytes):
            out.append(f"cpu_tier_bytes={settings.cpu_tier_bytes} exceeds the measured host "
                       f"headroom of {self.host_headroom_bytes} bytes")
        return out


@dataclass(frozen=True)
class Rendered:
    """A writer's output: the new file text, and notes to show the operator."""

    text: str
    notes: tuple[str, ...] = field(default=())


def _check_int(name: str, value, *, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_priority(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not (
            PRIORITY_MIN <= value <= PRIORITY_MAX):
        raise ValueError(f"{name} must be an int in {PRIORITY_MIN}..{PRIORITY_MAX}, got {value!r}")


def _check_choice(name: str, value, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}")


def gib(size_bytes: int) -> float:
    """Bytes -> GiB, rounded down to 0.01: engines that take "GB" get at most ``size_bytes``
    whether they read GB as 10**9 or 2**30 bytes."""
    return int(size_bytes / (1 << 30) * 100) / 100
