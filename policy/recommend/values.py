"""The recommendation's typed values: what ``kvtier recommend`` decided, and its evidence.

Every value is a frozen dataclass; :func:`~kvtier.policy.recommend.codec.encode` turns one into
JSON-ready data and :func:`~kvtier.policy.recommend.codec.decode` reads it back, checking types and
naming the path of a bad one. This module imports only the standard library, so the
dashboard reads a ``recommendation.json`` through it without pulling in the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.policy.recommend.codec import decode, encode, keyed, pairs  # noqa: F401  (decode, encode: re-exported)

OUTCOMES = ("offload", "do_not_offload", "inconclusive")


@dataclass(frozen=True)
class Reason:
    """One check behind a verdict: ``holds`` True is a reason not to offload, False means
    checked and it does not hold, None that the inputs cannot tell (``evidence`` says what
    would)."""

    name: str = keyed("reason")
    holds: bool | None = keyed("holds")
    evidence: str = keyed("evidence")

    @property
    def sentence(self) -> str:
        # the names are reasons not to offload: say which stand, which the data ruled out
        state = {True: "reason not to offload", False: "ruled out", None: "cannot tell"}[self.holds]
        return f"{state}: {self.name} ({self.evidence})"


@dataclass(frozen=True)
class Verdict:
    """Offload or not, the checks it rests on, and (``note``) one line saying why it differs
    from the reuse analysis's verdict when it does."""

    outcome: str = keyed("verdict")
    reasons: tuple[Reason, ...] = ()
    note: str | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"verdict must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")

    @property
    def words(self) -> str:
        return self.outcome.replace("_", " ")

    def held(self) -> tuple[Reason, ...]:
        return tuple(r for r in self.reasons if r.holds)


@dataclass(frozen=True)
class Knob:
    """One setting in words: which knob, the value, and why."""

    name: str
    value: object
    why: str


@dataclass(frozen=True)
class Change:
    """``metric`` over the evaluated requests of the period: baseline -> candidate, the change
    and its 5th-95th percentile interval; for a latency, each level's own interval too (the
    baseline's and the candidate's: what the engine should measure under each)."""

    metric: str
    baseline: float
    candidate: float
    change: float
    low: float
    high: float
    baseline_low: float | None = None
    baseline_high: float | None = None
    candidate_low: float | None = None
    candidate_high: float | None = None

    def contains(self, measured_change: float) -> bool:
        return self.low <= measured_change <= self.high


@dataclass(frozen=True)
class LatencyCard:
    """Which latency model made a recommendation's TTFT promise, and how: ``model`` (a name
    in ``kvtier.policy.latency.models.MODELS``; ``None``: no TTFT promise, ``why`` says why),
    the ``statistic`` promised, the noise ``draws`` and request ``resamples`` behind each
    interval, the ``arrivals`` of its replay, ``flag``: a model that missed its held-out check
    (never used for the promise), and ``thin``: costs that rest on few observations."""

    model: str | None
    why: str
    statistic: str = ""
    draws: int = 0
    resamples: int = 0
    arrivals: str = ""
    interval: str = "5th-95th percentile"
    flag: str | None = None
    thin: tuple[str, ...] = ()
    baseline: str = ""  # what the change is against (the GPU tier alone, the requests as served)


@dataclass(frozen=True)
class ColdCost:
    """Seconds to promote one ``block_tokens`` block from the cold tier, and to recompute it
    instead; ``source`` says where the figures came from, ``measured`` whether the promotion
    cost was measured (a probe or the store) rather than a default."""

    block_tokens: int
    promotion_s: float
    recompute_s: float
    source: str
    measured: bool = False

    def __post_init__(self) -> None:
        if self.block_tokens < 1 or self.promotion_s < 0 or not self.recompute_s > 0:
            raise ValueError(f"need block_tokens >= 1, promotion_s >= 0, recompute_s > 0; got "
                             f"{self.block_tokens}, {self.promotion_s}, {self.recompute_s}")

    @property
    def text(self) -> str:
        return (f"a cold promotion of a {self.block_tokens}-token block costs "
                f"{self.promotion_s * 1e3:.3g} ms, recomputing it {self.recompute_s * 1e3:.3g} ms "
                f"({self.source})")


@dataclass(frozen=True)
class ColdTierDecision:
    """Whether to add the cold (file) tier of ``cold_blocks`` blocks: ``gain`` is the share
    of prompt tokens it adds to what is served from cache, against the bar ``min_gain``."""

    add: bool
    reason: str
    gain: float
    min_gain: float
    cost: ColdCost
    cold_blocks: int = 0


@dataclass(frozen=True)
class HostCheck:
    """The CPU tier against host memory. Unchecked: ``source`` is None and ``why`` says what
    to give. Checked: the headroom, the margin kept free, the cap, the size asked for and the
    one recommended, and what the cap costs in LRU token hit ratio on later time."""

    checked: bool
    why: str | None = None
    source: str | None = None
    headroom_bytes: int | None = None
    safety_margin_bytes: int | None = None
    cap_bytes: int | None = None
    requested_cpu_bytes: int | None = None
    recommended_cpu_bytes: int | None = None
    capped: bool = False
    token_hit_ratio_lru_at_requested: float | None = None
    token_hit_ratio_lru_at_cap: float | None = None


@dataclass(frozen=True)
class CurvePoint:
    """A tier at ``capacity_bytes``: the whole hierarchy's token hit ratio, and the share of
    one prefill server's time the next GiB of the tier would free (``gain_per_gib``)."""

    capacity_bytes: int
    token_hit_ratio: float
    gain_per_gib: float


@dataclass(frozen=True)
class TierSize:
    """A tier's size from the one-pass LRU curve and the cost model.

    ``knee_bytes``: the smallest size beyond which no further GiB frees at least
    ``threshold_per_gib`` of a prefill server's time (``saved_s_per_token`` per token the tier
    serves instead of recomputing it). ``cap_bytes``: the measured capacity it is capped by
    (host headroom for the CPU tier, the cold path's free space), ``None`` when not measured
    (``cap_source`` says why). ``wanted_bytes`` is the knee, or the size the operator gave;
    ``chosen_bytes = min(wanted, cap)`` in whole blocks."""

    tier: str
    block_bytes: int
    knee_bytes: int
    wanted_bytes: int
    chosen_bytes: int
    cap_source: str
    threshold_per_gib: float
    gain_per_gib_at_chosen: float
    saved_s_per_token: float
    token_hit_ratio_without: float
    token_hit_ratio_at_chosen: float
    reason: str
    cap_bytes: int | None = None
    curve: tuple[CurvePoint, ...] = ()

    @property
    def chosen_blocks(self) -> int:
        return self.chosen_bytes // self.block_bytes

    @property
    def capped(self) -> bool:
        return self.chosen_bytes < self.wanted_bytes


@dataclass(frozen=True)
class SweepPoint:
    """One offload threshold replayed on the validation slice."""

    min_priority: int
    comparison: str
    token_hit_ratio: float
    recompute_tokens: int
    cpu_stores_total: int
    note: str = ""


@dataclass(frozen=True)
class HeldOut:
    """The admission model's quality on the latest training slice."""

    rows: int
    positive_rate: float
    brier: float
    roc_auc: float | None = None


@dataclass(frozen=True)
class ModelCard:
    """What was trained (enough to re-train it) and how well it did on held-out rows;
    ``weak`` says why the model set no threshold (its held-out ROC AUC too near chance),
    ``None`` when it did."""

    held_out: HeldOut
    features: tuple[str, ...] = ()
    config: tuple[tuple[str, object], ...] = pairs()
    weak: str | None = None


INPUT_SOURCES = ("measured", "calibrated", "given", "default")


@dataclass(frozen=True)
class InputSource:
    """One input a recommendation rests on (a cost parameter, the KV geometry, a tier's
    capacity), its value in the unit its name carries, and where it came from: one of
    :data:`INPUT_SOURCES` (``measured`` by the engine or a probe, ``calibrated`` by ``kvtier
    calibrate``, ``given`` by the operator, ``default``: a documented assumption)."""

    name: str
    value: float
    source: str
    note: str = ""
    observations: int | None = None  # how many the value rests on (None: not counted)

    def __post_init__(self) -> None:
        if self.source not in INPUT_SOURCES:
            raise ValueError(f"source must be one of {', '.join(INPUT_SOURCES)}, "
                             f"got {self.source!r}")


@dataclass(frozen=True)
class PrefillServers:
    servers: int
    source: str


@dataclass(frozen=True)
class TierBlocks:
    """The tier sizes, in blocks of the trace, the evidence was measured at."""

    gpu: int
    cpu: int


@dataclass(frozen=True)
class HitRatios:
    """Token hit ratios on later time: GPU only, CPU tier admitting every block, CPU tier
    with the learned gate."""

    gpu_only: float
    cpu_lru_admit_all: float | None = None
    cpu_learned_priority: float | None = None
    # vLLM's own semantics (its CPU tier holds a copy of what it stores from the GPU) at the
    # recommended size and vLLM's chosen eviction_policy and store_threshold
    vllm: float | None = None


@dataclass(frozen=True)
class RollbackRule:
    """The rollback rule to deploy with the recommendation: when the p99 TTFT (or ITL, when
    budgeted) of the newest tier configuration stays over budget for ``sustained_s``, p99 over
    ``window_s`` windows, disable that tier (:mod:`kvtier.policy.rollback.rule`)."""

    ttft_p99_s: float
    sustained_s: int
    window_s: int
    itl_p99_s: float | None = None
    # The tier configuration whose requests the recommendation (and these budgets) came from:
    # the rule is for the rollout that follows it (None: not recorded).
    baseline_tier_config: str | None = None


@dataclass(frozen=True)
class PairScore:
    """One admission rule and eviction order's token hit ratio on the validation slice."""

    pair: str
    token_hit_ratio: float


@dataclass(frozen=True)
class CpuPolicy:
    """The CPU tier's admission rule and eviction order, chosen together on the training period
    alone (:mod:`kvtier.policy.learn.pairs`): ``admission`` ``all``, ``sightings`` (a block on
    its ``min_sightings``-th request) or ``learned`` (score >= ``threshold``); ``eviction``
    ``lru`` or ``next-use``; every candidate's figure on the training period's latest
    ``validation_requests`` (plain LRU first; the learned parts fitted on the
    ``fit_requests`` before them), and ``why``, the sentence that explains the choice;
    ``gpu_sightings`` >= 2: the GPU prefix cache keeps a new block only from that request."""

    pair: str
    admission: str
    eviction: str
    why: str
    validation: tuple[PairScore, ...] = ()
    min_sightings: int = 0
    threshold: float | None = None
    fit_requests: int = 0
    validation_requests: int = 0
    gpu_sightings: int = 0


@dataclass(frozen=True)
class Evidence:
    """Everything behind a recommendation. Only ``reuse_verdict``, ``host_memory`` and
    ``token_hit_ratio`` are always there (a do-not-offload verdict stops before the rest)."""

    reuse_verdict: Verdict
    host_memory: HostCheck
    token_hit_ratio: HitRatios
    model: ModelCard | None = None
    seed: int | None = None
    block_tokens: int | None = None
    prefill_servers: PrefillServers | None = None
    tiers_blocks: TierBlocks | None = None
    vllm_file_tier: ColdTierDecision | None = None
    train_requests: int | None = None
    evaluated_requests: int | None = None
    sweep: tuple[SweepPoint, ...] = ()
    token_range_priorities: tuple[tuple[str, int], ...] = pairs()
    token_range_sweep: tuple[SweepPoint, ...] = ()
    vllm_cpu_setting_recomputed_tokens: tuple[tuple[str, int], ...] = pairs()
    admitter_misses: int | None = None
    sizes: tuple[TierSize, ...] = ()
    expected_vs_gpu_only: tuple[Change, ...] = ()
    # the same against the CPU tier admitting every block (LRU): what an engine that cannot
    # gate by priority (vLLM, LMCache, SGLang) runs at the recommended size
    expected_admit_all_vs_gpu_only: tuple[Change, ...] = ()
    expected_vllm_vs_gpu_only: tuple[Change, ...] = ()  # vLLM's, as token_hit_ratio.vllm
    rollback: RollbackRule | None = None
    inputs: tuple[InputSource, ...] = ()
    cpu_policy: CpuPolicy | None = None  # the CPU tier's admission and eviction, chosen together
    latency_model: LatencyCard | None = None
    # the recommended configuration against the requests as they were served (the tier
    # configuration the store recorded them under): what recommend --check measures
    expected_vs_served: tuple[Change, ...] = ()
    served_tier_config: str | None = None

    def size(self, tier: str) -> TierSize | None:
        return next((s for s in self.sizes if s.tier == tier), None)

    def defaults(self) -> tuple[InputSource, ...]:
        """The inputs that are documented assumptions, not measured or given."""
        return tuple(i for i in self.inputs if i.source == "default")

