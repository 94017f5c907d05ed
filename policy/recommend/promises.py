"""Did a recommendation keep its promises? Its predictions against what the engine measured
on the requests it served under the recommended tier configuration.

A recommendation predicts, for its tier sizes, the token hit ratio and the TTFT p50/p95/p99
(each with a 5th-95th percentile interval) on *later time*: after the first share of its
requests (its training share) had warmed the tiers. :func:`check_promises` measures the
same on the requests recorded under the new configuration, in arrival order, leaving out
that same first share (after a restart the tiers start empty), and says of each prediction
whether the measurement falls inside its interval. The hit ratio carries no interval of its
own: it holds within ``tolerance_points`` percentage points.

Which prediction is the engine's: vLLM's replayed under vLLM's own semantics, for vLLM;
with a per-block priority gate in the engine's settings (``offload_min_priority``:
TensorRT-LLM, Dynamo) the learned gate's; otherwise (LMCache, SGLang) the CPU tier admitting
every block; with no CPU tier, the GPU tier alone.
Pure: records in, a :class:`PromiseCheck` out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.recommend.recommendation import Recommendation
from kvtier.policy.recommend.values import Change

TTFT_METRICS = (("ttft_p50_s", 50), ("ttft_p95_s", 95), ("ttft_p99_s", 99))
DEFAULT_TOLERANCE_POINTS = 2.0
FALLBACK_REQUESTS, FALLBACK_SHARE = 40, 0.5  # a recommendation that records neither


@dataclass(frozen=True)
class Promise:
    """One prediction: ``predicted`` within ``[low, high]``, and what was ``measured``
    (``None``: the requests do not say, e.g. no TTFT recorded)."""

    metric: str
    predicted: float
    low: float
    high: float
    measured: float | None

    @property
    def held(self) -> bool | None:
        if self.measured is None:
            return None
        return self.low <= self.measured <= self.high


@dataclass(frozen=True)
class PromiseCheck:
    """The verdict on one recommendation. ``requests``: recorded under ``tier_config``;
    ``needed``: how many it takes to judge; ``warmup``: the first ones left out;
    ``basis``: which of the recommendation's predictions the engine's settings run."""

    tier_config: str
    requests: int
    needed: int
    warmup: int
    basis: str
    promises: tuple[Promise, ...] = ()
    served_tier_config: str | None = None  # the changes were judged against its requests

    @property
    def enough(self) -> bool:
        return self.requests >= self.needed

    @property
    def more_needed(self) -> int:
        return max(0, self.needed - self.requests)

    @property
    def held(self) -> bool | None:
        """True when every measured promise held, False when one did not, None when there
        is nothing to judge yet."""
        judged = [p.held for p in self.promises if p.held is not None]
        if not self.enough or not judged:
            return None
        return all(judged)

    @property
    def judged(self) -> int:
        return max(0, self.requests - self.warmup)


def check_promises(rec: Recommendation, engine: str | None,
                   records: Sequence[RequestRecord], tier_config: str, *,
                   min_requests: int | None = None,
                   tolerance_points: float = DEFAULT_TOLERANCE_POINTS,
                   served: Sequence[RequestRecord] = ()) -> PromiseCheck:
    """``rec``'s predictions for ``engine`` running its settings (``None``: the neutral
    ones) against ``records``, the requests served under ``tier_config``. ``min_requests``:
    how many to wait for (default: as many as the recommendation was made from).
    ``served``: the requests the recommendation was made from, as the store recorded them
    under the tier configuration they were served with (``Evidence.served_tier_config``):
    the promised *change* (each TTFT percentile, new configuration less that one) is judged
    against the change measured between the two, the same later share of each."""
    if min_requests is not None and min_requests < 1:
        raise ValueError(f"min_requests must be >= 1, got {min_requests!r}")
    if not tolerance_points >= 0:
        raise ValueError(f"tolerance_points must be >= 0, got {tolerance_points!r}")
    evidence = rec.evidence
    train, evaluated = evidence.train_requests, evidence.evaluated_requests
    made_from = train + evaluated if train and evaluated else FALLBACK_REQUESTS
    share = train / made_from if train and evaluated else FALLBACK_SHARE
    ordered = sorted(records, key=lambda r: r.arrival_s)
    warmup = int(len(ordered) * share)
    later = ordered[warmup:]
    basis, ratio, changes = _prediction(rec, engine)
    tolerance = tolerance_points / 100
    promises = [Promise("token_hit_ratio", ratio, ratio - tolerance, ratio + tolerance,
                        _hit_ratio(later))]
    by_metric = {c.metric: c for c in changes}
    ttft = np.asarray([r.ttft_s for r in later if r.ttft_s is not None], dtype=float)
    before = _later_ttft(served, share)
    vs_served = {c.metric: c for c in _served_changes(rec, engine)}
    for metric, q in TTFT_METRICS:
        change = by_metric.get(metric)
        measured = float(np.percentile(ttft, q)) if ttft.size else None
        if change is not None:
            if change.candidate_low is not None:  # the level's own interval
                low, high = change.candidate_low, change.candidate_high
            else:  # an older recommendation: the change's interval about the baseline
                low, high = max(0.0, change.baseline + change.low), change.baseline + change.high
            promises.append(Promise(metric, change.candidate, low, high, measured))
        moved = vs_served.get(metric)
        if moved is not None and before.size:
            promises.append(Promise(f"{metric} change", moved.change, moved.low, moved.high,
                                    None if measured is None else
                                    measured - float(np.percentile(before, q))))
    return PromiseCheck(tier_config, len(ordered), min_requests or made_from, warmup, basis,
                        tuple(promises), rec.evidence.served_tier_config if before.size else None)


def _later_ttft(records: Sequence[RequestRecord], share: float) -> np.ndarray:
    ordered = sorted(records, key=lambda r: r.arrival_s)
    return np.asarray([r.ttft_s for r in ordered[int(len(ordered) * share):] if r.ttft_s is not None],
                      dtype=float)


def _served_changes(rec: Recommendation, engine: str | None) -> tuple[Change, ...]:
    """The promised change against the requests as served: vLLM's candidate (what the
    recommendation replays for vLLM), or the GPU tier alone for a recommendation without a
    CPU tier."""
    settings = (rec.for_engine(engine) if engine else None) or rec.settings
    if engine == "vllm" or not settings.cpu_tier_bytes:
        return rec.evidence.expected_vs_served
    return ()


def improvement_words(check: PromiseCheck) -> str | None:
    """A promised TTFT decrease the engine did not show, in words (``None``: none missed)."""
    missed = [p for p in check.promises if p.metric.endswith(" change") and p.held is False
              and p.predicted < 0 and p.measured is not None and p.measured > p.high]
    if not missed:
        return None
    return "; ".join(f"{p.metric.split()[0].removesuffix('_s').replace('_', ' ')} was to fall by "
                     f"{-p.predicted * 1e3:.1f} ms, it moved {p.measured * 1e3:+.1f} ms"
                     for p in missed) + ": the promised improvement did not materialise"


def _prediction(rec: Recommendation, engine: str | None
                ) -> tuple[str, float, tuple[Change, ...]]:
    """(basis in words, predicted token hit ratio, TTFT changes against the GPU tier alone)."""
    ratios, evidence = rec.evidence.token_hit_ratio, rec.evidence
    settings = (rec.for_engine(engine) if engine else None) or rec.settings
    if not settings.cpu_tier_bytes or ratios.cpu_lru_admit_all is None:
        alone = tuple(dataclasses.replace(c, candidate=c.baseline, candidate_low=c.baseline_low,
                                          candidate_high=c.baseline_high)
                      for c in evidence.expected_vs_gpu_only)  # the GPU tier alone's levels
        if engine == "vllm" and ratios.vllm is not None:  # its GPU tier under its own semantics
            return "vLLM's GPU tier alone (the minimal CPU tier)", ratios.vllm, alone
        return "the GPU tier alone", ratios.gpu_only, alone
    if engine == "vllm" and ratios.vllm is not None:
        gpu = (f", kvtier_gpu_sightings {settings.gpu_sightings}" if settings.gpu_sightings
               else "")
        return (f"vLLM's CPU tier of {settings.cpu_tier_bytes} bytes "
                f"({settings.eviction_policy or 'lru'}, store_threshold "
                f"{settings.store_threshold or 0}{gpu}) under vLLM's semantics", ratios.vllm,
                evidence.expected_vllm_vs_gpu_only)
    if settings.offload_min_priority is not None and ratios.cpu_learned_priority is not None:
        return ("the CPU tier behind the learned priority gate", ratios.cpu_learned_priority,
                evidence.expected_vs_gpu_only)
    return ("the CPU tier admitting every block (LRU)", ratios.cpu_lru_admit_all,
            evidence.expected_admit_all_vs_gpu_only)


def _hit_ratio(records: Sequence[RequestRecord]) -> float | None:
    """Prompt tokens served from any tier over prompt tokens, of the records that say."""
    split = [r for r in records if r.gpu_hit_tokens is not None]
    prompt = sum(r.prompt_tokens for r in split)
    if not prompt:
        return None
    served = sum(r.gpu_hit_tokens + (r.cpu_promotion_tokens or 0) + (r.cold_promotion_tokens or 0)
                 for r in split)
    return served / prompt
