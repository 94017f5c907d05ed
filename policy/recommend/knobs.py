"""The recommendation's settings in words (:class:`Knob`), and the guardrails push checks."""

from __future__ import annotations

from kvtier.policy.recommend.headroom import HostLimit
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
