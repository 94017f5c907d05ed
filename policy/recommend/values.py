"""The recommendation's typed values: what ``kvtier recommend`` decided, and its evidence.

Every value is a frozen dataclass; :func:`encode` turns one into JSON-ready data and
:func:`decode` reads it back, checking each field's type and naming the path of a bad one
(``ValueError``). Fields that hold a mapping are tuples of pairs whose JSON form is an object
(field metadata ``{"json": "object"}``); a ``None`` in a field whose default is ``None`` is
left out of the JSON and comes back as that default. This module imports only the standard
library, so the dashboard reads a ``recommendation.json`` through it without pulling in the
analysis.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field

OUTCOMES = ("offload", "do_not_offload", "inconclusive")
AS_OBJECT = {"json": "object"}


def pairs(**kwargs) -> dataclasses.Field:
    """A field holding ``((key, value), ...)`` whose JSON form is an object."""
    return field(default=(), metadata=AS_OBJECT, **kwargs)


def keyed(key: str, **kwargs) -> dataclasses.Field:
    """A field written under another JSON key (kept for readers of earlier files)."""
    return field(metadata={"key": key}, **kwargs)


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


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
        state = {True: "holds", False: "checked, does not hold", None: "cannot tell"}[self.holds]
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
    """``metric``: baseline -> candidate (per window on average), change and its 5th-95th
    percentile interval."""

    metric: str
    baseline: float
    candidate: float
    change: float
    low: float
    high: float


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
    """What was trained (enough to re-train it) and how well it did on held-out rows."""

    held_out: HeldOut
    features: tuple[str, ...] = ()
    config: tuple[tuple[str, object], ...] = pairs()


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


@dataclass(frozen=True)
class RollbackRule:
    """The rollback rule to deploy with the recommendation: when the p99 TTFT (or ITL, when
    budgeted) of the newest tier configuration stays over budget for ``sustained_s``, p99 over
    ``window_s`` windows, disable that tier (:mod:`policy.rollback.rule`)."""

    ttft_p99_s: float
    sustained_s: int
    window_s: int
    itl_p99_s: float | None = None


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
    rollback: RollbackRule | None = None

    def size(self, tier: str) -> TierSize | None:
        return next((s for s in self.sizes if s.tier == tier), None)


def encode(value):
    """JSON-ready data of a value (dataclasses, tuples, scalars), ``None`` fields left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None and f.default is None:  # absent: decode restores the default
                continue
            if f.metadata.get("json") == "object":
                out[_key(f)] = {str(k): encode(v) for k, v in item}
            else:
                out[_key(f)] = encode(item)
        return out
    if isinstance(value, (tuple, list)):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    return value


def decode(kind, data, where: str = "value"):
    """``data`` (as :func:`encode` wrote it) as a ``kind``; ``ValueError`` naming ``where``."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if data is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return decode(inner, data, where)
    if dataclasses.is_dataclass(kind):
        return _decode_dataclass(kind, data, where)
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"{where}: expected a list, got {data!r}")
        args = typing.get_args(kind)
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        if item is None:  # a fixed-length tuple, e.g. (str, int)
            if len(data) != len(args):
                raise ValueError(f"{where}: expected {len(args)} items, got {data!r}")
            return tuple(decode(a, d, f"{where}[{i}]") for i, (a, d) in enumerate(zip(args, data)))
        return tuple(decode(item, d, f"{where}[{i}]") for i, d in enumerate(data))
    return _scalar(kind, data, where)


def _decode_dataclass(kind, data, where: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {data!r}")
    hints = typing.get_type_hints(kind)
    known = {_key(f) for f in dataclasses.fields(kind)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values = {}
    for f in dataclasses.fields(kind):
        if _key(f) not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}: missing {_key(f)!r}")
            continue
        item, hint = data[_key(f)], hints[f.name]
        if f.metadata.get("json") == "object":
            if not isinstance(item, dict):
                raise ValueError(f"{where}.{f.name}: expected an object, got {item!r}")
            (pair,) = typing.get_args(hint)[:1]
            value_kind = typing.get_args(pair)[1]
            values[f.name] = tuple((k, decode(value_kind, v, f"{where}.{f.name}.{k}"))
                                   for k, v in item.items())
        else:
            values[f.name] = decode(hint, item, f"{where}.{f.name}")
    try:
        return kind(**values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


def _scalar(kind, data, where: str):
    if kind is object or kind is typing.Any:
        return _frozen(data)
    if kind is float and isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    if kind in (int, str, bool) and isinstance(data, kind) and (kind is bool or not isinstance(data, bool)):
        return data
    if kind is type(None) and data is None:
        return None
    raise ValueError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {data!r}")


def _frozen(data):
    """JSON lists as tuples, so a decoded value is as immutable as an encoded one."""
    if isinstance(data, list):
        return tuple(_frozen(item) for item in data)
    return data
