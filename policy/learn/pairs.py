"""What kvtier deploys for a CPU tier: an admission rule and an eviction order, chosen together
on the training period alone.

Admission (which GPU victims get a CPU slot): every block; the sighting filter (a block on its
N-th request, N in :data:`SIGHTINGS`; :class:`~kvtier.policy.sim.policies.SightingAdmitter`);
or the learned admission model's score over a threshold. Eviction: LRU, or the learned next-use
order behind its LRU shadow. The pairs also come with the GPU prefix cache filtered
(``gpu_sightings`` :data:`GPU_SIGHTINGS`: a new block cached only from its second request,
``SimConfig.gpu_sightings``; kvtier's vLLM connector applies it in the engine), last among
the candidates: one-time prompts then take no cached slot in either tier, which no CPU-tier
admission can give where the GPU tier is a large share of the stack (not with the learned
admission, whose scores are for an unfiltered GPU's offers, nor with the CPU tier's sighting
filter at N <= 2, which a filtered GPU leaves nothing to do).

:func:`choose_pair` fits the learned parts on the earlier
``1 - VALIDATION_FRACTION`` of the training requests, replays every pair over the training
period and counts its latest :data:`VALIDATION_FRACTION` (never seen by a fit): plain LRU
admitting every block is a candidate like the others, and stays unless another pair serves at
least :data:`MIN_GAIN` more of that slice's prompt tokens. A pair with a learned part (the
next-use order, the learned admission) must serve :data:`LEARNED_LEAD_SHRINK` more than the
pair chosen without one: its lead on the slice overstates its lead on later traffic by about
that much, a fixed rule's does not. Within :data:`TIE` of the best, the simpler pair wins (the
order of :func:`candidates`). Nothing after the training period is read.

A chosen pair other than plain LRU is deployed behind plain LRU's shadow
(:class:`~kvtier.policy.learn.shadowed.Shadowed`, the pair's admitter with its order as the
candidate): where the traffic turns and the pair falls behind, the tier admits every block
and evicts by LRU until the pair's ghost leads again. The simple rule (:data:`SIMPLE_RULE`:
LRU admitting a block on its second request: libCacheSim's LRU behind its Bloom filter,
vLLM's ``store_threshold`` 2, Dynamo KVBM's frequency filter) runs there as a third ghost where the pair admits every
block, so a pair that turns worse than it yields to it too (not where the GPU prefix cache is
filtered: every GPU victim has passed that filter already).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.admission_model import AdmissionModel, ModelConfig
from kvtier.policy.learn.deploy import (LAST_BLOCK_DEAD_BELOW, READOUT_CANDIDATES,
                                        last_block_reuse, learned_factory)
from kvtier.policy.learn.nextuse import NextUseModel, Readout
from kvtier.policy.learn.nextuse_fit import FitConfig, fit_next_use
from kvtier.policy.learn.nextuse_tier import compiled_order, compiled_signals
from kvtier.policy.learn.pipeline import THRESHOLDS, fit, score_offers, smoothed_best
from kvtier.policy.learn.replay import IndexedAdmitter, Tiers, replay
from kvtier.policy.learn.shadowed import Shadowed
from kvtier.policy.learn.signal_table import signal_table
from kvtier.policy.sim.compiled import core
from kvtier.policy.sim.policies import SightingAdmitter
from kvtier.policy.sim.trace import BlockTrace

VALIDATION_FRACTION = 0.2
SIGHTINGS = (2, 3)
GPU_SIGHTINGS = 2
MIN_GAIN = 0.002  # of the validation slice's prompt tokens: 0.2 points of hit ratio
TIE = 0.0005
# what a pair with a learned part (the next-use order, the learned admission) must serve above
# the pair chosen without one: its validation lead is optimistic. Over 39 cells (tier sizes and
# train fractions) of the Mooncake trace, the WEKA dev set and slice and synthetic traffic
# without a shift, trained on the earlier part, a learned pair's lead over plain LRU on the
# validation slice shrank by 0.58 points on average on the later part (median 0.55, 273
# learned candidates); a fixed rule's held (median +0.01). Over the same cells and 8 with a
# shift, requiring it changed 4 of 47 choices (Mooncake at GPU 4,000 / CPU 4,000 blocks: 8% ->
# 18% of the LRU -> Belady gap; at 1,000 / 2,500: 32% -> 31%; two within a point)
LEARNED_LEAD_SHRINK = 0.006
# the deployed pair's shadow follows plain LRU over a short window: after a shift at the end of
# the training period (tests' traffic.mixed and agentic with shift) a 500-request window kept a
# pair that had turned bad for long enough to lose 1.7 points to LRU; 100 stays within 0.5
SHADOW_WINDOW_REQUESTS = 100
# the simple rule a deployed pair admitting every block also shadows: on synthetic chat and
# mixed traffic whose mix shifts at the end of the training period (seeds 0-2), a pair chosen
# before the shift (the next-use order admitting every block) fell 1.5-3.3 points below this
# rule on later traffic behind plain LRU's shadow alone, and within 0.7 of it (or above) with
# this ghost beside LRU's
SIMPLE_RULE_SIGHTINGS = 2
ADMISSIONS = ("all", "sightings", "learned")
EVICTIONS = ("lru", "next-use")


@dataclass(frozen=True)
class Pair:
    """An admission rule and an eviction order: ``min_sightings`` for the sighting filter,
    ``threshold`` for the learned admission score, ``readout`` the next-use order's."""

    admission: str = "all"
    eviction: str = "lru"
    min_sightings: int = 0
    threshold: float | None = None
    readout: str | None = None
    gpu_sightings: int = 0

    def __post_init__(self) -> None:
        if self.admission not in ADMISSIONS or self.eviction not in EVICTIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)} and eviction "
                             f"one of {', '.join(EVICTIONS)}, got {self.admission!r}, "
                             f"{self.eviction!r}")
        if (self.admission == "sightings") != (self.min_sightings >= 2):
            raise ValueError(f"the sighting filter needs min_sightings >= 2 (and only it), "
                             f"got {self.min_sightings} with {self.admission!r}")
        if self.gpu_sightings < 0 or self.gpu_sightings == 1:
            raise ValueError(f"gpu_sightings must be 0 or >= 2, got {self.gpu_sightings}")

    @property
    def label(self) -> str:
        admission = {"all": "admit all",
                     "sightings": f"admit on sighting {self.min_sightings}",
                     "learned": f"learned admission >= {self.threshold:g}"
                     if self.threshold is not None else "learned admission"}[self.admission]
        eviction = "LRU" if self.eviction == "lru" else "next-use order behind LRU shadow"
        gpu = (f"GPU cache on sighting {self.gpu_sightings}, " if self.gpu_sightings else "")
        return f"{gpu}{admission} + {eviction}"

    @property
    def plain_lru(self) -> bool:
        return self.admission == "all" and self.eviction == "lru" and not self.gpu_sightings

    @property
    def learned_part(self) -> bool:
        """Whether a part of it is fitted to the training period (the next-use order, the
        learned admission)."""
        return self.eviction == "next-use" or self.admission == "learned"


SIMPLE_RULE = Pair("sightings", min_sightings=SIMPLE_RULE_SIGHTINGS)


@dataclass(frozen=True)
class Validated:
    """One pair's token hit ratio on the training period's latest slice."""

    pair: Pair
    hit_ratio: float


@dataclass(frozen=True, eq=False)
class PairChoice:
    """The chosen pair, every candidate's validation figure (plain LRU first), the requests
    fitted and validated on, the sentence that explains the choice, and the fitted parts the
    pair needs (``next_use``/``readout`` for the next-use order, ``admission_model`` for the
    learned admission)."""

    pair: Pair
    validation: tuple[Validated, ...]
    fit_requests: int
    validation_requests: int
    why: str
    next_use: NextUseModel | None = None
    readout: Readout | None = None
    admission_model: AdmissionModel | None = None

    @property
    def lru_hit_ratio(self) -> float:
        return self.validation[0].hit_ratio


def most_candidates() -> int:
    """How many pairs :func:`choose_pair` validates when every learned part can be fitted."""
    return len(candidates(THRESHOLDS[-1], READOUT_CANDIDATES[0].label()))


def candidates(threshold: float | None, readout: str | None) -> tuple[Pair, ...]:
    """Every pair, simplest first (plain LRU is the first; those that filter the GPU prefix
    cache too come last)."""
    admissions = [Pair(), *(Pair("sightings", min_sightings=n) for n in SIGHTINGS)]
    if threshold is not None:
        admissions.append(Pair("learned", threshold=threshold))
    pairs = list(admissions)
    if readout is not None:
        pairs += [Pair(a.admission, "next-use", a.min_sightings, a.threshold, readout)
                  for a in admissions]
    # with the GPU filtered, the CPU tier's own sighting filter at the same N changes nothing
    # (every GPU victim has passed it), and the learned admission's scores are for the offers
    # of an unfiltered GPU (a filtered one offers other blocks at other times): both left out
    pairs += [dataclasses.replace(p, gpu_sightings=GPU_SIGHTINGS) for p in list(pairs)
              if not (p.admission == "sightings" and p.min_sightings <= GPU_SIGHTINGS)
              and p.admission != "learned"]
    return tuple(pairs)


def choose_pair(train: Sequence[RequestRecord], tiers: Tiers, *,
                trace: BlockTrace | None = None, seed: int = 0) -> PairChoice:
    """Fit on the earlier training requests, validate every pair on the latest ones."""
    train = tuple(train)
    trace = trace if trace is not None else BlockTrace.from_records(train)
    cut = int(len(train) * (1 - VALIDATION_FRACTION))
    if cut < 2 or len(train) - cut < 1:
        raise ValueError(f"need at least 3 training requests to choose a pair, got {len(train)}")
    fit_trace = trace.requests(0, cut)
    hit = lambda cpu, admitter=None, gpu_sightings=0: replay(
        train, tiers, cpu, admitter=admitter, count_from=cut, trace=trace,
        gpu_sightings=gpu_sightings).result.token_hit_ratio
    model, readout, readout_label = _next_use(train[:cut], fit_trace, train, trace, tiers, hit,
                                              seed)
    admission_model, scores, threshold = _learned(train[:cut], fit_trace, train, trace, tiers,
                                                  hit, seed)
    signals = signal_table(train, trace, model.models) if model is not None else None
    scored = []
    for pair in candidates(threshold, readout_label):  # each pair as it is, no shadow
        cpu = ("lru" if pair.eviction == "lru" else
               learned_factory(model, readout, signals, shadowed=False))
        scored.append(Validated(pair, hit(cpu, _admitter(pair, scores), pair.gpu_sightings)))
    chosen, simple = _best(scored)
    return PairChoice(chosen.pair, tuple(scored), cut, len(train) - cut,
                      _why(chosen, simple, scored, len(train) - cut), model, readout,
                      admission_model)


class FittedInputs:
    """What a choice's fitted parts read of the records they are deployed on: the next-use
    order's signal table and the learned admission's offer scores, each worked out on first
    use and then shared by every pair of the choice deployed on the same records
    (:func:`deployed` of one pair needs one of them at most; ``evaluate --candidates`` deploys
    them all)."""

    def __init__(self, choice: PairChoice, records: Sequence[RequestRecord], tiers: Tiers,
                 trace: BlockTrace | None = None) -> None:
        self.choice, self.records, self.tiers, self.trace = choice, records, tiers, trace

    @functools.cached_property
    def signals(self):
        return signal_table(self.records, self.trace, self.choice.next_use.models)

    @functools.cached_property
    def scores(self):
        return score_offers(self.choice.admission_model, self.records, self.tiers,
                            trace=self.trace)


def replay_deployed(choice: PairChoice, records: Sequence[RequestRecord], tiers: Tiers, *,
                    count_from: int = 0, trace: BlockTrace | None = None,
                    inputs: FittedInputs | None = None, built: list | None = None):
    """``records`` replayed with the chosen pair deployed (:func:`deployed`, and the GPU
    prefix cache filtered where the pair says so), counted from ``count_from``; ``built``
    (a list) receives the shadowed tier the replay built, for its statistics."""
    cpu = deployed(choice, records, tiers, trace, inputs=inputs)
    if built is not None and cpu != "lru":
        build = cpu

        def cpu(capacity):
            built.append(build(capacity))
            return built[-1]
    return replay(records, tiers, cpu, count_from=count_from, trace=trace,
                  gpu_sightings=choice.pair.gpu_sightings)


def deployed(choice: PairChoice, records: Sequence[RequestRecord], tiers: Tiers,
             trace: BlockTrace | None = None, *, inputs: FittedInputs | None = None):
    """The CPU policy for :func:`kvtier.policy.learn.replay.replay` of ``records``
    (``trace``: their arrays): ``"lru"`` for an LRU tier admitting every block, else
    ``capacity -> tier``, the chosen pair (its learned parts as fitted) behind plain LRU's
    shadow. The GPU prefix cache's filter is the replay's (``choice.pair.gpu_sightings``:
    :func:`replay_deployed`). ``inputs``: the fitted parts' inputs for these records, shared
    with other pairs of the same choice (:class:`FittedInputs`)."""
    pair = choice.pair
    if pair.admission == "all" and pair.eviction == "lru":
        return "lru"
    if inputs is None:
        inputs = FittedInputs(choice, records, tiers, trace)
    elif inputs.records is not records or inputs.tiers != tiers:
        raise ValueError("inputs were worked out for other records or tier sizes")
    order, shared, block_tokens = core().Lru, None, None
    if pair.eviction == "next-use":
        signals = inputs.signals
        block_tokens = signals.block_tokens
        model, readout = choice.next_use, choice.readout

        def order(capacity):
            return compiled_order(capacity, model, readout, shared)
    scores = inputs.scores if pair.admission == "learned" else None

    def build(capacity):
        nonlocal shared
        if pair.eviction == "next-use":  # one signal table per replay, shared by its orders
            shared = compiled_signals(signals, choice.next_use)
        ghosts = [("lru", core().Lru)]
        if shadows_simple_rule(pair):
            ghosts.append((SIMPLE_RULE.label, core().Lru, _admitter(SIMPLE_RULE, None)))
        return Shadowed(capacity, [*ghosts, (pair.label, order, _admitter(pair, scores))],
                        signals=shared, block_tokens=block_tokens,
                        window_requests=SHADOW_WINDOW_REQUESTS)
    return build


def shadows_simple_rule(pair: Pair) -> bool:
    """Whether ``pair`` deployed runs :data:`SIMPLE_RULE`'s ghost beside plain LRU's: where
    it admits every block to the CPU tier in the next-use order (plain LRU is deployed as it
    is) and the GPU prefix cache is not filtered. A pair that
    filters already has plain LRU's ghost, admitting every block, as its other hypothesis;
    a second filter's ghost beside it there pulled ahead on short windows of noise (beside
    the learned admission, up to 1.05 points lost: Mooncake at 10,000 and 20,000 CPU blocks,
    chat at 5,000)."""
    return pair.admission == "all" and pair.eviction == "next-use" and not pair.gpu_sightings


def _admitter(pair: Pair, scores):
    if pair.admission == "sightings":
        return SightingAdmitter(pair.min_sightings)
    if pair.admission == "learned":
        return IndexedAdmitter(scores, pair.threshold)
    return None


def _next_use(fit_records, fit_trace, train, trace, tiers, hit, seed):
    """The next-use model fitted on the earlier requests and the readout that served the
    validation slice best; ``(None, None, None)`` when the model cannot be fitted."""
    try:
        model = fit_next_use(fit_records, signal_table(fit_records, fit_trace),
                             FitConfig(seed=seed))
    except ValueError:
        return None, None, None
    signals = signal_table(train, trace, model.models)
    dead = last_block_reuse(fit_trace) < LAST_BLOCK_DEAD_BELOW
    best, best_hit = None, -1.0
    for candidate in READOUT_CANDIDATES:
        readout = Readout(candidate.kind, candidate.q, candidate.horizon_s, dead)
        ratio = hit(learned_factory(model, readout, signals, shadowed=False))
        if ratio > best_hit:
            best, best_hit = readout, ratio
    return model, best, best.label()


def _learned(fit_records, fit_trace, train, trace, tiers, hit, seed):
    """The admission model trained on the earlier requests (labels at these tier sizes), its
    scores for every offer of the training period and the threshold the validation slice
    preferred; ``(None, None, None)`` when it cannot be trained (too few or one-class rows)."""
    try:
        learned = fit(fit_records, train, tiers, ModelConfig(seed=seed), thresholds=(),
                      shares_replay=True, train_trace=fit_trace, scored_trace=trace)
    except ValueError:
        return None, None, None
    sweep = [(t, hit("lru", IndexedAdmitter(learned.scores, t))) for t in THRESHOLDS[1:]]
    return learned.model, learned.scores, smoothed_best(sweep)


def _best(scored: Sequence[Validated]) -> tuple[Validated, Validated]:
    """The chosen pair, and the pair without a learned part it was measured against: plain LRU
    (the first) unless such a pair serves :data:`MIN_GAIN` more; a learned pair only if it
    serves :data:`LEARNED_LEAD_SHRINK` more than that one. Within :data:`TIE` of the best of a
    kind, the first of it."""
    simple = _first_best([v for v in scored if not v.pair.learned_part], MIN_GAIN)
    learned = [v for v in scored if v.pair.learned_part]
    if learned and max(v.hit_ratio for v in learned) >= simple.hit_ratio + LEARNED_LEAD_SHRINK:
        return _first_best(learned, 0.0), simple
    return simple, simple


def _first_best(scored: Sequence[Validated], min_gain: float) -> Validated:
    top = max(v.hit_ratio for v in scored)
    if top < scored[0].hit_ratio + min_gain:
        return scored[0]
    return next(v for v in scored if v.hit_ratio >= top - TIE)


def _why(chosen: Validated, simple: Validated, scored: Sequence[Validated],
         requests: int) -> str:
    """The sentence for ``chosen``; ``simple``: the pair without a learned part that a learned
    pair had to lead (:func:`_best`)."""
    lru = scored[0].hit_ratio
    slice_words = (f"the training period's latest {VALIDATION_FRACTION:.0%} "
                   f"({requests:,} requests), which no fit saw")
    margin = (f"a learned pair must lead it by {LEARNED_LEAD_SHRINK * 100:.1f} points, about "
              f"what a learned pair's lead on the slice has shrunk by on later traffic in "
              f"kvtier's checks")
    if chosen.pair.learned_part:
        return (f"{chosen.pair.label}: token hit ratio {chosen.hit_ratio:.4f} against plain "
                f"LRU's {lru:.4f} ({(chosen.hit_ratio - lru) * 100:+.1f} points) on "
                f"{slice_words}, the best of {len(scored)} pairs (a simpler pair wins within "
                f"{TIE * 100:.2f} points) and {(chosen.hit_ratio - simple.hit_ratio) * 100:.1f} "
                f"points above {simple.pair.label}, chosen among the pairs with nothing "
                f"learned ({margin})")
    learned = max((v for v in scored if v.pair.learned_part), key=lambda v: v.hit_ratio,
                  default=None)
    passed = (f"; the best learned pair, {learned.pair.label}, served {learned.hit_ratio:.4f} "
              f"({margin})" if learned is not None and learned.hit_ratio > chosen.hit_ratio
              else "")
    if chosen.pair.plain_lru:
        fixed = [v for v in scored[1:] if not v.pair.learned_part]
        best = max(fixed, key=lambda v: v.hit_ratio, default=None)
        rival = (f"; the best of them, {best.pair.label}, served {best.hit_ratio:.4f}"
                 if best is not None else "")
        return (f"plain LRU admitting every block: none of the {len(fixed)} other pairs with "
                f"nothing learned served {MIN_GAIN * 100:.1f} points more than its {lru:.4f} "
                f"token hit ratio on {slice_words}{rival}{passed}")
    return (f"{chosen.pair.label}: token hit ratio {chosen.hit_ratio:.4f} against plain LRU's "
            f"{lru:.4f} ({(chosen.hit_ratio - lru) * 100:+.1f} points) on {slice_words}, "
            f"the best of the pairs with nothing learned (a simpler pair wins within "
            f"{TIE * 100:.2f} points){passed}")
