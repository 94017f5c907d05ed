"""The Recommendation: an immutable value from the analysis to the writers and the report.

It holds the verdict (offload or not, and why), the engine-neutral settings plus the ones
each engine can express, the knobs in words, the expected change against the baseline with
bootstrap intervals, and the evidence (model card, sweep, reuse verdict). ``to_json`` is the
form ``kvtier push --recommendation`` reads: ``settings`` and ``guardrails`` at the top,
everything else under ``evidence``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from policy.recommend.expected import Change
from policy.writers.settings import EngineSettings, Guardrails

VERDICTS = ("offload", "do_not_offload")


@dataclass(frozen=True)
class Knob:
    """One setting in words: which knob, the value, and why."""

    name: str
    value: object
    why: str


@dataclass(frozen=True)
class Recommendation:
    verdict: str
    reasons: tuple[str, ...]
    settings: EngineSettings
    engine_settings: tuple[tuple[str, EngineSettings], ...] = ()
    engine_notes: tuple[tuple[str, str], ...] = ()
    guardrails: Guardrails = field(default_factory=Guardrails)
    knobs: tuple[Knob, ...] = ()
    expected: tuple[Change, ...] = ()
    evidence: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")

    def for_engine(self, engine: str) -> EngineSettings | None:
        return dict(self.engine_settings).get(engine)

    def to_json(self, engine: str | None = None) -> dict:
        """The push-readable JSON (for one engine's settings, or the neutral ones)."""
        settings = self.settings if engine is None else self.for_engine(engine)
        if settings is None:
            raise ValueError(f"no settings for engine {engine!r}; have "
                             f"{', '.join(e for e, _ in self.engine_settings) or 'none'}")
        return {"kind": "kvtier.recommendation", "version": 1,
                "settings": settings_dict(settings),
                "guardrails": {k: v for k, v in dataclasses.asdict(self.guardrails).items()
                               if v is not None},
                "notes": [n for e, n in self.engine_notes if engine in (None, e)],
                "evidence": {"verdict": self.verdict, "reasons": list(self.reasons),
                             "knobs": [dataclasses.asdict(k) for k in self.knobs],
                             "expected": [c.to_dict() for c in self.expected],
                             "engines": {e: settings_dict(s) for e, s in self.engine_settings},
                             **self.evidence}}


def settings_dict(settings: EngineSettings) -> dict:
    """Only the fields that are set (``None`` and empty mean: leave the engine's value)."""
    out = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if value is None or value == () or (f.name == "ranks" and value == 1):
            continue
        if f.name == "retention_classes":  # its JSON form is an object
            value = dict(value)
        elif f.name == "retention_ranges":
            value = {c.name: c.to_dict() for c in value}
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out
