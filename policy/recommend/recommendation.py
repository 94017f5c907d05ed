"""The Recommendation: an immutable value from the analysis to the writers, the report and
the dashboard.

It holds the verdict (offload or not, the checks behind it), the engine-neutral settings plus
the ones each engine can express, the knobs in words, the expected change against the
baseline with bootstrap intervals, and the typed :class:`~kvtier.policy.recommend.values.Evidence`.
``to_json`` is the form ``kvtier push --recommendation`` and the collector's recommendation
export read: ``settings`` and ``guardrails`` at the top, everything else under ``evidence``
(``evidence.verdict`` is the outcome as a string); :func:`from_json` reads it back. Standard
library only (the writers' settings module is too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kvtier.policy.recommend.values import Change, Evidence, Knob, Reason, Verdict, decode, encode
from kvtier.policy.writers.settings import EngineSettings, Guardrails

KIND, VERSION = "kvtier.recommendation", 2
# what to_json writes under "evidence" besides the Evidence fields
_OWN_KEYS = ("verdict", "reasons", "note", "knobs", "expected", "engines", "engine_notes")


@dataclass(frozen=True)
class Recommendation:
    verdict: Verdict
    settings: EngineSettings
    evidence: Evidence
    engine_settings: tuple[tuple[str, EngineSettings], ...] = ()
    engine_notes: tuple[tuple[str, str], ...] = ()
    guardrails: Guardrails = field(default_factory=Guardrails)
    knobs: tuple[Knob, ...] = ()
    expected: tuple[Change, ...] = ()

    def for_engine(self, engine: str) -> EngineSettings | None:
        return dict(self.engine_settings).get(engine)

    def knob(self, name: str) -> Knob | None:
        return next((k for k in self.knobs if k.name == name), None)

    def to_json(self, engine: str | None = None) -> dict:
        """The push-readable JSON (for one engine's settings, or the neutral ones)."""
        settings = self.settings if engine is None else self.for_engine(engine)
        if settings is None:
            raise ValueError(f"no settings for engine {engine!r}; have "
                             f"{', '.join(e for e, _ in self.engine_settings) or 'none'}")
        own = {"verdict": self.verdict.outcome, "reasons": encode(self.verdict.reasons),
               "note": self.verdict.note, "knobs": encode(self.knobs),
               "expected": encode(self.expected),
               "engines": {e: settings_dict(s) for e, s in self.engine_settings},
               "engine_notes": [[e, n] for e, n in self.engine_notes]}
        return {"kind": KIND, "version": VERSION,
                **({} if engine is None else {"engine": engine}),  # push refuses another engine
                "settings": settings_dict(settings),
                "guardrails": {k: v for k, v in dataclasses.asdict(self.guardrails).items()
                               if v is not None},
                "notes": [n for e, n in self.engine_notes if engine in (None, e)],
                "evidence": {**{k: v for k, v in own.items() if v is not None},
                             **encode(self.evidence)}}


def from_json(doc: dict) -> Recommendation:
    """A :class:`Recommendation` from :meth:`Recommendation.to_json`'s neutral form;
    ``ValueError`` naming the first bad or missing key."""
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError(f"not a kvtier recommendation (kind {KIND!r} expected)")
    if doc.get("version") != VERSION:
        raise ValueError(f"recommendation version {doc.get('version')!r}; this kvtier reads "
                         f"version {VERSION} (re-run kvtier recommend)")
    evidence = doc.get("evidence")
    if not isinstance(evidence, dict):
        raise ValueError("evidence: expected an object")
    own = {k: evidence[k] for k in _OWN_KEYS if k in evidence}
    rest = {k: v for k, v in evidence.items() if k not in _OWN_KEYS}
    try:
        engines = tuple((name, EngineSettings.from_mapping(s))
                        for name, s in (own.get("engines") or {}).items())
        settings = EngineSettings.from_mapping(doc.get("settings", {}))
        guardrails = Guardrails(**(doc.get("guardrails") or {}))
    except (TypeError, ValueError) as error:
        raise ValueError(f"settings: {error}") from None
    verdict = Verdict(decode(str, own.get("verdict"), "evidence.verdict"),
                      decode(tuple[Reason, ...], own.get("reasons", []), "evidence.reasons"),
                      decode(str | None, own.get("note"), "evidence.note"))
    return Recommendation(
        verdict=verdict, settings=settings,
        evidence=decode(Evidence, rest, "evidence"),
        engine_settings=engines,
        engine_notes=decode(tuple[tuple[str, str], ...], own.get("engine_notes", []),
                            "evidence.engine_notes"),
        guardrails=guardrails,
        knobs=decode(tuple[Knob, ...], own.get("knobs", []), "evidence.knobs"),
        expected=decode(tuple[Change, ...], own.get("expected", []), "evidence.expected"))


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
