"""The recommendation's settings in words (:class:`Knob`), and the guardrails push checks."""

from __future__ import annotations

from policy.recommend.headroom import HostLimit
from policy.recommend.values import ColdTierDecision, HostCheck, Knob, SweepPoint
from policy.writers.settings import Guardrails


def guardrails(host: HostLimit | None) -> Guardrails:
    """What ``kvtier push`` checks: the cap this recommendation was sized under."""
    return Guardrails(host_headroom_bytes=None if host is None else host.cap_bytes)


def host_words(host: HostCheck) -> str:
    """How the CPU size relates to host memory, in a clause."""
    if not host.checked:
        return "not checked against host memory"
    if host.capped:
        return (f"capped from {host.requested_cpu_bytes} bytes at the host headroom less its "
                f"safety margin ({host.cap_bytes} bytes)")
    return f"within the host headroom less its safety margin ({host.cap_bytes} bytes)"


def cpu_knobs(cpu_bytes: int, chosen: SweepPoint, chosen_gt: SweepPoint,
              classes: tuple[int, ...], host: HostCheck) -> tuple[Knob, ...]:
    return (
        Knob("cpu_tier_bytes", cpu_bytes,
             f"the CPU capacity the model was trained and measured at; {host_words(host)}"),
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
