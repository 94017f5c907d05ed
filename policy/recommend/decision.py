"""The recommendation's verdict: the reuse analysis's, and what recommend checks on top.

``kvtier analyze`` and ``kvtier recommend`` call the same :func:`kvtier.policy.reuse.verdict.verdict`
with the same inputs (the GPU-only hit ratio, the p99 TTFT budget, the host headroom), so
given those they agree. Recommend checks two more things itself and says in one line
(``Verdict.note``) when that changes the answer:

* the CPU tier's size from the curve (:mod:`kvtier.policy.recommend.sizing`): when no size pays
  (or the cap leaves no block), it is do-not-offload although no reuse reason holds;
* an inconclusive analysis (a check it could not make) becomes offload when no reason not to
  offload holds and the curve gives the CPU tier a size: the gain is then measured by replay
  on later time, and the note names the checks that were missing.
"""

from __future__ import annotations

from kvtier.policy.recommend.values import Reason, TierSize, Verdict

SIZED = "no CPU tier size pays"


def decide(reuse: Verdict, cpu: TierSize) -> Verdict:
    """Recommend's verdict from the reuse analysis's and the CPU tier's size."""
    if reuse.outcome == "do_not_offload":
        return reuse
    sized = Reason(SIZED, not cpu.chosen_blocks, cpu.reason)
    reasons = (*reuse.reasons, sized)
    if not cpu.chosen_blocks:
        return Verdict("do_not_offload", reasons,
                       f"the reuse analysis says {reuse.words}, but no CPU tier size pays: "
                       f"{cpu.reason}")
    if reuse.outcome == "inconclusive":
        unknown = ", ".join(f"'{r.name}'" for r in reuse.reasons if r.holds is None)
        return Verdict("offload", reasons,
                       f"the reuse analysis alone is inconclusive (it could not check {unknown}); "
                       "no reason not to offload holds and the curve sizes a CPU tier, so "
                       "recommend offloads and measures the gain by replay on later time")
    return Verdict("offload", reasons)
