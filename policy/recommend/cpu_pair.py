"""The CPU tier's admission rule and eviction order in a recommendation: the pair chosen on the
training period (:mod:`kvtier.policy.learn.pairs`) as the evidence records it, and what vLLM's
own sweep replays of it."""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.pairs import PairChoice, choose_pair
from kvtier.policy.learn.replay import Tiers
from kvtier.policy.recommend.values import CpuPolicy, PairScore


def choose(train: Sequence[RequestRecord], tiers: Tiers, seed: int) -> PairChoice:
    """The pair at the recommended sizes, chosen on the training requests alone."""
    return choose_pair(train, tiers, seed=seed)


def evidence(choice: PairChoice) -> CpuPolicy:
    """The choice as the recommendation's evidence: the pair, every candidate's validation
    figure (plain LRU first), the requests fitted and validated on, and why."""
    pair = choice.pair
    return CpuPolicy(pair.label, pair.admission, pair.eviction, choice.why,
                     tuple(PairScore(v.pair.label, v.hit_ratio) for v in choice.validation),
                     pair.min_sightings, pair.threshold, choice.fit_requests,
                     choice.validation_requests, pair.gpu_sightings)


def thresholds(choice: PairChoice) -> tuple[int, ...]:
    """vLLM's ``store_threshold`` candidates for the chosen admission: the sighting filter is
    vLLM's ``store_threshold`` (its scheduler offers a request's prompt from the first chunk
    unless it loaded some, so an offer is a sighting), replayed beside 0; any other admission,
    0 alone (vLLM cannot gate by a score)."""
    pair = choice.pair
    return (0, pair.min_sightings) if pair.admission == "sightings" else (0,)


def gpu_sightings(choice: PairChoice) -> tuple[int, ...]:
    """The GPU prefix-cache filter's candidates for vLLM (kvtier's connector applies it): the
    pair's, replayed beside none; none alone when the pair does not filter the GPU."""
    return (0, choice.pair.gpu_sightings) if choice.pair.gpu_sightings else (0,)
