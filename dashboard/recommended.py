"""How the recommendation page words a recommendation's values: each setting as every engine
receives it (vLLM's CPU tier is larger than the engine-neutral one: it also holds a copy of
the blocks it stores from the GPU), and an expected latency change drawn the way it goes,
lower being better."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.policy.recommend.recommendation import Recommendation
from kvtier.policy.recommend.values import Change

MIB = 1 << 20
# the knobs each engine receives in a setting of its own (the EngineSettings field)
_PER_ENGINE = {"cpu_tier_bytes": "cpu_tier_bytes"}


def setting_value(rec: Recommendation, name: str, value) -> str:
    """A knob's value as each engine receives it: ``"vllm: 28,720,000 (27.39 MiB); trtllm,
    lmcache: 20,000,000 (19.07 MiB)"`` where the engines receive different values; the value
    alone where every engine receives it (or the recommendation names no engine)."""
    field = _PER_ENGINE.get(name)
    received: dict[str, list[str]] = {}
    for engine, settings in rec.engine_settings if field else ():
        given = getattr(settings, field)
        if given is not None:
            received.setdefault(formatted(name, given), []).append(engine)
    if not received or list(received) == [formatted(name, value)]:
        return formatted(name, value)
    return "; ".join(f"{', '.join(engines)}: {text}" for text, engines in received.items())


def formatted(name: str, value) -> str:
    if isinstance(value, tuple):
        return str(list(value))
    if name.endswith("_bytes") and isinstance(value, int) and value:
        return f"{value:,} ({value / MIB:,.2f} MiB)"
    return str(value)


@dataclass(frozen=True)
class DeltaStyle:
    """How a latency change is drawn (Streamlit's ``delta_arrow`` and ``delta_color``): the
    arrow follows the change's sign; green when its whole interval is a decrease (lower
    latency is better), red when it is all an increase, grey when it spans no change."""

    arrow: str
    colour: str


def latency_delta(change: Change) -> DeltaStyle:
    arrow = "down" if change.change < 0 else "up" if change.change > 0 else "off"
    if change.high < 0:
        return DeltaStyle(arrow, "green")
    if change.low > 0:
        return DeltaStyle(arrow, "red")
    return DeltaStyle(arrow, "gray")
