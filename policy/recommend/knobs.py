"""The recommendation's settings in words (:class:`Knob`), and the guardrails push checks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvtier.policy.recommend.headroom import HostLimit
from kvtier.policy.recommend.recommendation import Recommendation
from kvtier.policy.recommend.values import ColdTierDecision, Knob, SweepPoint, TierSize
from kvtier.policy.writers.settings import Guardrails


def guardrails(host: HostLimit | None) -> Guardrails:
    """What ``kvtier push`` checks: the cap this recommendation was sized under."""
    return Guardrails(host_headroom_bytes=None if host is None else host.cap_bytes)


def cpu_knobs(cpu: TierSize, chosen: SweepPoint, chosen_gt: SweepPoint,
              classes: tuple[int, ...]) -> tuple[Knob, ...]:
    return (
        Knob("cpu_tier_bytes", cpu.chosen_bytes,
             f"{cpu.reason}; the gate below was trained and measured at this size"),
        Knob("offload_min_priority", chosen.min_priority,
             chosen.note or
             f"fewest recomputed tokens on the validation slice ({chosen.token_hit_ratio:.4f} "
             f"token hit ratio with '>='; with TRT-LLM's documented '>' the best threshold is "
             f"{chosen_gt.min_priority} at {chosen_gt.token_hit_ratio:.4f})"),
        Knob("retention_priorities", tuple(classes),
             "learned value classes (P(reuse) x (recompute - promotion) per byte, 0..100)"),
    )


def file_knob(decision: ColdTierDecision | None, cold_bytes: int) -> tuple[Knob, ...]:
    if decision is None:
        return ()
    return (Knob("vllm_file_tier_bytes", cold_bytes if decision.add else 0, decision.reason),)


# The knobs only some engines can set (every other knob is every engine's): a recommendation
# for other engines leaves them out.
KNOB_ENGINES = {"offload_min_priority": ("trtllm", "dynamo"),
                "retention_priorities": ("trtllm",),
                "vllm_file_tier_bytes": ("vllm",)}
_PRIORITY_ENGINES = frozenset(KNOB_ENGINES["offload_min_priority"])


def for_engines(rec: Recommendation, engines: Sequence[str]) -> Recommendation:
    """``rec`` holding only what ``engines`` can use: their settings and notes, their knobs,
    and the per-block priorities (neutral settings, threshold and token-range sweeps) only
    when one of them gates offloading by priority."""
    wanted = set(engines)
    priorities = bool(wanted & _PRIORITY_ENGINES)
    settings = rec.settings if priorities else dataclasses.replace(
        rec.settings, offload_min_priority=None, retention_priorities=())
    evidence = rec.evidence if priorities else dataclasses.replace(
        rec.evidence, sweep=(), token_range_priorities=(), token_range_sweep=())
    return dataclasses.replace(
        rec, settings=settings, evidence=evidence,
        engine_settings=tuple((e, s) for e, s in rec.engine_settings if e in wanted),
        engine_notes=tuple((e, n) for e, n in rec.engine_notes if e in wanted),
        knobs=tuple(k for k in rec.knobs if wanted & set(KNOB_ENGINES.get(k.name, wanted))))
