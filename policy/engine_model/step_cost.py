"""What one scheduler step costs: a line over the step's work.

``duration_s = overhead_s + prefill_token_s * prefill tokens + prefill_request_s * prefill
requests + attention_s * prefill attention + decode_request_s * decode requests +
decode_context_s * decode context tokens + decode_pass_s * decode passes + cached_token_s *
cached tokens + loaded_byte_s * loaded bytes``, every coefficient >= 0.

*Cached tokens* are the prompt tokens that requests starting in the step found in a tier (GPU
hits and promotions alike): an engine references, records and maps each such block when it
admits the request. A GPU-only run shows the cost through its GPU hits, and it carries over to
the CPU tier's promotions (the reference engine: 0.96 us a token fitted on its GPU-only
phase, 0.90 on its CPU-tier phase).

*Loaded bytes* are the KV bytes the step promoted into the GPU tier: an engine that promotes
inside the step that admits the request (the reference engine: a slot taken, a copy, the
block recorded, about 3 us a token on this kind of host) spends them there; one that loads
asynchronously before scheduling (vLLM's offloading connector) shows ~0 here and its loads
in the transfer links instead. A run without promotions cannot tell it (0).

A *decode pass* is 1 in a step that decodes anything, else 0: an engine decodes its running
requests in one batched forward pass whose fixed cost is paid once however many decode. It is
kept apart from ``overhead_s`` (paid by every step, before its prefills) because an engine
that emits a prompt's first token right after its own prefill (the reference engine) runs the
decode pass after the step's prefills: folded into the overhead, it would delay every first
token by a decode pass it never waits for.

*Prefill attention* is the sum over a step's prefill chunks of ``n * (c + n / 2)`` for a
chunk of ``n`` tokens after ``c`` tokens of context: the token-position pairs attention
reads, so a deep chunk costs more than a shallow one of the same size. A
:class:`~kvtier.collector.events.StepRecord` keeps only the sums over its chunks; read
from one, the term is taken as if its chunks were equal (exact for one chunk a step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np

from kvtier.collector.events import StepRecord

FEATURES = ("steps", "prefill_tokens", "prefill_requests", "prefill_attention",
            "decode_requests", "decode_context_tokens", "decode_passes", "cached_tokens",
            "loaded_bytes")


@dataclass(frozen=True)
class StepCost:
    """Seconds per unit of each of :data:`FEATURES`, in that order."""

    overhead_s: float = 0.0
    prefill_token_s: float = 0.0
    prefill_request_s: float = 0.0
    attention_s: float = 0.0
    decode_request_s: float = 0.0
    decode_context_s: float = 0.0
    decode_pass_s: float = 0.0
    cached_token_s: float = 0.0
    loaded_byte_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
                raise ValueError(f"{f.name} must be a finite number >= 0, got {value!r}")

    @property
    def coefficients(self) -> np.ndarray:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=float)

    @classmethod
    def from_coefficients(cls, values) -> StepCost:
        return cls(*(float(v) for v in values))

    def seconds(self, features: np.ndarray) -> np.ndarray:
        """Each step's duration from its rows of :data:`FEATURES`."""
        return np.asarray(features, dtype=float) @ self.coefficients

    def to_dict(self) -> dict:
        return asdict(self)


def step_features(steps: Sequence[StepRecord]) -> np.ndarray:
    """One row of :data:`FEATURES` per step record."""
    rows = np.array([(s.prefill_tokens, s.prefill_requests, s.prefill_context_tokens,
                      s.decode_requests, s.decode_context_tokens, s.cached_tokens, s.loaded_bytes)
                     for s in steps], dtype=float).reshape(-1, 7)
    tokens, requests, context = rows[:, 0], rows[:, 1], rows[:, 2]
    per_request = np.maximum(requests, 1.0)
    attention = tokens * (context + tokens / 2) / per_request  # equal chunks
    passes = (rows[:, 3] > 0).astype(float)
    return np.column_stack([np.ones(len(rows)), tokens, requests, attention, rows[:, 3], rows[:, 4],
                            passes, rows[:, 5], rows[:, 6]])


def step_durations(steps: Sequence[StepRecord]) -> np.ndarray:
    """Each step's ``duration_s``, else the gap to the next step's ``time_s``; NaN where
    neither is known (the last step without a duration)."""
    times = np.array([s.time_s for s in steps], dtype=float)
    gaps = np.append(np.diff(times), np.nan)
    recorded = np.array([np.nan if s.duration_s is None else s.duration_s for s in steps], dtype=float)
    return np.where(np.isnan(recorded), gaps, recorded)
