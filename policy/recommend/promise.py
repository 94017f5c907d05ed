"""The recommendation's TTFT promise: which latency model makes it (and its card), the
requests as served to compare a change with, and the verdict's hit-quality check.

A promise goes through :mod:`kvtier.policy.latency`; here it meets the recommendation: the
card records the model, the statistic and the draws (``Evidence.latency_model``), the requests
the store recorded under one tier configuration are the baseline a change is judged against
(``recommend --check``), and a CPU tier is recommended only where the engine's promoted
tokens cost less than recomputed ones and the promised TTFT gain lies beyond its noise.
"""

from __future__ import annotations

import dataclasses

from kvtier.collector.request_tokens import RequestTokens
from kvtier.policy.cost import CostParams
from kvtier.policy.latency import predict
from kvtier.policy.latency.choice import LatencyChoice, choose
from kvtier.policy.latency.models import QueueModel
from kvtier.policy.learn.replay import Replayed
from kvtier.policy.learn.split import Split
from kvtier.policy.recommend.values import LatencyCard, Reason, Verdict
from kvtier.policy.sim.result import SimResult


def latency_model(choice: LatencyChoice | None, params: CostParams, servers: int,
                  given_servers: int | None = None) -> tuple[object | None, LatencyCard]:
    """The model that promises TTFT (``None``: none may) and its card for the evidence.
    ``choice``: what the engine's costs allow (``choice.choose``); ``None`` (a trace): the
    queue model on ``params``, on measured costs only. The queue model serves ``servers``
    prefill servers unless ``given_servers`` fixed them."""
    choice = choice or choose(params)
    model = choice.model
    if isinstance(model, QueueModel) and given_servers is None:
        model = dataclasses.replace(model, servers=servers)
    if model is None:
        return None, LatencyCard(None, choice.why, flag=choice.flag, thin=choice.thin)
    return model, LatencyCard(model.name, choice.why, predict.STATISTIC,
                              predict.DRAWS if model.noisy else 1, predict.RESAMPLES,
                              model.arrivals, flag=choice.flag, thin=choice.thin)


def as_served(split: Split) -> tuple[Replayed | None, str | None]:
    """The evaluated requests with the split the engine recorded for them, and the one tier
    configuration they were all served under; ``(None, None)`` when a record has no split (a
    trace) or they were served under several configurations (nothing one phase can repeat)."""
    later = split.records[split.count_from:]
    configs = {r.tier_config_id for r in later}
    if not later or any(r.gpu_hit_tokens is None for r in later) or len(configs) != 1:
        return None, None
    served = Replayed(SimResult(), tuple(later), tuple(RequestTokens.measured(r) for r in later))
    return served, configs.pop()


def hit_quality(verdict: Verdict, model, card, vs_gpu, candidate: Replayed) -> Verdict:
    """Offload only where a promoted token measurably costs this engine less than a
    recomputed one, and the promised TTFT p50 gain is larger than its interval's noise (the
    interval lies below 0). ``verdict`` as it was when the latency model promises nothing
    (the card says why)."""
    from kvtier.policy.latency.token_costs import token_costs

    if model is None:
        return verdict
    promoted = [(o.cpu_promotion_tokens, o.gpu_hit_tokens) for o in candidate.outcomes
                if o.cpu_promotion_tokens]
    costs = token_costs(model, promoted)
    p50 = next((c for c in vs_gpu if c.metric == "ttft_p50_s"), None)
    reasons = list(verdict.reasons)
    if costs is not None:
        reasons.append(Reason("a promoted token costs no less than a recomputed one",
                              not costs.promotion_pays, costs.words()))
    if p50 is not None:
        reasons.append(Reason("no TTFT gain beyond the noise", p50.high >= 0,
                              f"TTFT p50 change {p50.change * 1e3:+.2f} ms "
                              f"[{p50.low * 1e3:+.2f}, {p50.high * 1e3:+.2f}] ({card.model} model)"))
    if any(r.holds for r in reasons[len(verdict.reasons):]):
        why = "; ".join(f"{r.name}: {r.evidence}" for r in reasons[len(verdict.reasons):] if r.holds)
        return Verdict("do_not_offload", tuple(reasons),
                       f"the CPU tier raises the hit ratio, but {why}")
    return Verdict(verdict.outcome, tuple(reasons), verdict.note)
