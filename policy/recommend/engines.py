"""Per-engine settings from the recommendation's choices: each registered writer turns the
:class:`Choices` into its engine's settings and notes (``recommended``), and validates them;
one that does not validate is not written, with a note why.

TensorRT-LLM and Dynamo take the learned priority threshold directly; vLLM, LMCache and
SGLang cannot gate by a per-block priority, so they get the CPU size and their nearest knob,
with a note saying what is lost (each writer module says how).
"""

from __future__ import annotations

from kvtier.policy.writers import WRITERS
from kvtier.policy.writers.choices import Choices
from kvtier.policy.writers.settings import EngineSettings


def neutral(cpu_bytes: int, min_priority: int | None, classes) -> EngineSettings:
    return EngineSettings(cpu_tier_bytes=cpu_bytes, offload_min_priority=min_priority,
                          retention_priorities=tuple(classes), kv_events=True)


def settings(choices: Choices) -> tuple[tuple, tuple]:
    """``((engine, EngineSettings), ...)`` and ``((engine, note), ...)``, engines in the
    registry's order."""
    candidates, notes = {}, []
    for engine, module in WRITERS.items():
        candidates[engine], engine_notes = module.recommended(choices)
        notes += [(engine, note) for note in engine_notes]
    return _checked(candidates, notes)


def off() -> tuple:
    """Offloading off where an engine can say so (``OFF``; vLLM drops its transfer config)."""
    return _checked({engine: module.OFF for engine, module in WRITERS.items()
                     if module.OFF is not None}, [])[0]


def _checked(candidates: dict, notes: list) -> tuple[tuple, tuple]:
    good = []
    for engine, value in candidates.items():
        try:
            WRITERS[engine].validate(value)
        except ValueError as error:
            notes.append((engine, f"not written: {error}"))
            continue
        good.append((engine, value))
    return tuple(good), tuple(notes)
