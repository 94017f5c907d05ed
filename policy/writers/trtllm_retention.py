"""Per-request-class retention by token range: TensorRT-LLM's ``KvCacheRetentionConfig``.

A request class (a gateway route, a request type) gives each range of its prompt a 0..100
retention priority, and its decoded tokens one more (TensorRT-LLM ``executor.h``, ``KvCacheRetentionConfig``):
``TokenRangeRetentionConfig(token_start, token_end, priority, duration_ms)`` per range, and
``decode_retention_priority`` / ``decode_duration_ms``. TensorRT-LLM requires the ranges to
be prompt-only and not to overlap; ``token_end=None`` runs to the end of the prompt. Tokens
no range covers keep the default priority (35). The retention config is per request, so it
travels with each request (LLM API, Dynamo's TensorRT-LLM handler), not in the server YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_RETENTION_PRIORITY = 35  # executor.h kDefaultRetentionPriority


@dataclass(frozen=True)
class TokenRange:
    """Prompt tokens ``[token_start, token_end)`` at ``priority`` (0..100); ``token_end=None``
    is the end of the prompt; after ``duration_ms`` the blocks fall back to priority 35."""

    token_start: int
    token_end: int | None
    priority: int
    duration_ms: int | None = None

    def __post_init__(self) -> None:
        _int("token_start", self.token_start, 0)
        _int("priority", self.priority, 0, 100)
        if self.token_end is not None:
            _int("token_end", self.token_end, self.token_start + 1)
        if self.duration_ms is not None:
            _int("duration_ms", self.duration_ms, 1)

    def to_dict(self) -> dict:
        return {"token_start": self.token_start, "token_end": self.token_end,
                "priority": self.priority, "duration_ms": self.duration_ms}


@dataclass(frozen=True)
class RetentionClass:
    """One request class's retention: prompt ranges in order, not overlapping, and decode."""

    name: str
    token_ranges: tuple[TokenRange, ...]
    decode_priority: int = DEFAULT_RETENTION_PRIORITY
    decode_duration_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a retention class needs a non-empty name, got {self.name!r}")
        object.__setattr__(self, "token_ranges", tuple(self.token_ranges))
        if not self.token_ranges:
            raise ValueError(f"retention class {self.name!r} has no token ranges")
        for before, after in zip(self.token_ranges, self.token_ranges[1:]):
            if before.token_end is None or after.token_start < before.token_end:
                raise ValueError(f"retention class {self.name!r}: token ranges must be in order "
                                 f"and not overlap (TensorRT-LLM refuses overlaps), got "
                                 f"{before.to_dict()} then {after.to_dict()}")
        _int(f"{self.name}: decode_priority", self.decode_priority, 0, 100)
        if self.decode_duration_ms is not None:
            _int(f"{self.name}: decode_duration_ms", self.decode_duration_ms, 1)

    @property
    def priorities(self) -> tuple[int, ...]:
        return tuple(sorted({r.priority for r in self.token_ranges} | {self.decode_priority}))

    def to_dict(self) -> dict:
        """The LLM API keyword form of ``KvCacheRetentionConfig``."""
        return {"token_range_retention_configs": [r.to_dict() for r in self.token_ranges],
                "decode_retention_priority": self.decode_priority,
                "decode_duration_ms": self.decode_duration_ms}

    @classmethod
    def from_dict(cls, name: str, data: Mapping) -> RetentionClass:
        """From :meth:`to_dict`'s form; ``ValueError`` naming unknown keys."""
        if not isinstance(data, Mapping):
            raise ValueError(f"retention class {name!r} must be a JSON object, got {data!r}")
        known = {"token_range_retention_configs", "decode_retention_priority", "decode_duration_ms"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"retention class {name!r}: unknown key(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        ranges = data.get("token_range_retention_configs") or []
        try:
            parsed = tuple(TokenRange(**r) for r in ranges)
        except TypeError as error:
            raise ValueError(f"retention class {name!r}: bad token range: {error}") from None
        return cls(name, parsed, data.get("decode_retention_priority", DEFAULT_RETENTION_PRIORITY),
                   data.get("decode_duration_ms"))


def parse_classes(value) -> tuple[RetentionClass, ...]:
    """``RetentionClass``es from themselves or from ``{name: to_dict() form}``."""
    if isinstance(value, Mapping):
        value = [RetentionClass.from_dict(name, data) for name, data in sorted(value.items())]
    classes = tuple(value)
    for item in classes:
        if not isinstance(item, RetentionClass):
            raise ValueError(f"retention_ranges must map class names to retention configs, got {item!r}")
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ValueError(f"retention_ranges names a class twice: {names}")
    return classes


def _int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (maximum is not None and value > maximum)):
        bound = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")
