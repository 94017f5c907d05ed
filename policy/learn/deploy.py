"""What kvtier would deploy: the learned next-use order behind its LRU shadow, chosen on the
training period only.

:func:`choose` fits the next-use model on the training requests, replays each candidate
readout (:data:`READOUT_CANDIDATES`) on them and counts the latest :data:`VALIDATION_FRACTION`
(earlier ones only warm the tiers), beside LRU on the same slice. The best readout is
deployed inside :class:`~kvtier.policy.learn.shadowed.Shadowed` (so it yields to LRU whenever it falls
behind online); when no readout beat LRU on the slice, the deployment is plain LRU. Nothing
after the training period is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.nextuse import NextUseModel, Readout
from kvtier.policy.learn.nextuse_fit import FitConfig, fit_next_use
from kvtier.policy.learn.nextuse_tier import NextUseTier, compiled_order, compiled_signals
from kvtier.policy.learn.replay import Tiers, replay
from kvtier.policy.learn.shadowed import Shadowed
from kvtier.policy.learn.signal_table import SignalTable, signal_table
from kvtier.policy.sim.compiled import core
from kvtier.policy.sim.trace import BlockTrace

READOUT_CANDIDATES = (Readout("next_use", q=0.5), Readout("reuse_within", horizon_s=100.0),
                      Readout("reuse_within", horizon_s=1000.0))
VALIDATION_FRACTION = 0.2
LAST_BLOCK_DEAD_BELOW = 0.1  # last blocks re-sent this rarely are treated as dead


@dataclass(frozen=True)
class Choice:
    """The deployment for one tier size: ``readout`` None means plain LRU. ``sweep``: (label,
    validation hit ratio) per candidate, LRU first."""

    model: NextUseModel
    readout: Readout | None
    sweep: tuple[tuple[str, float], ...]
    last_block_reuse: float


def learned_factory(model: NextUseModel, readout: Readout, signals: SignalTable, *,
                    shadowed: bool = True) -> Callable:
    """``capacity -> tier``: the learned order, alone or behind its LRU shadow, for a replay
    of the requests ``signals`` describes (coded with the model's vocabulary)."""
    if signals.models != model.models:
        raise ValueError("the signals were coded with another model vocabulary than the model's")
    if not shadowed:
        return lambda capacity: NextUseTier(capacity, model, readout, signals)

    def build(capacity):
        shared = compiled_signals(signals, model)
        learned = lambda c: compiled_order(c, model, readout, shared)
        return Shadowed(capacity, [("lru", core().Lru), ("learned", learned)], signals=shared,
                        block_tokens=signals.block_tokens)
    return build


def deployment(model: NextUseModel, readout: Readout) -> dict:
    """The JSON document the engine plug-in loads: the model and how to read it."""
    return {"model": model.to_json(),
            "readout": {"kind": readout.kind, "q": readout.q, "horizon_s": readout.horizon_s,
                        "last_block_dead": readout.last_block_dead}}


def last_block_reuse(trace: BlockTrace) -> float:
    """Share of prompts whose last block a later request re-sends (training requests)."""
    c = core()
    interner = c.Interner()
    later = c.next_uses(interner.ids(trace.hashes), len(interner))
    ends = trace.offsets[1:] - 1
    ends = ends[trace.offsets[1:] > trace.offsets[:-1]]
    return int((later[ends] != c.NEVER_USED).sum()) / max(1, len(trace))


def choose(train: Sequence[RequestRecord], tiers: Tiers, *, trace: BlockTrace | None = None,
           config: FitConfig = FitConfig(),
           candidates: Sequence[Readout] = READOUT_CANDIDATES) -> Choice:
    """Fit and choose on ``train`` alone (``trace``: its arrays, when records carry none)."""
    trace = trace if trace is not None else BlockTrace.from_records(train)
    signals = signal_table(train, trace)
    model = fit_next_use(train, signals, config)
    reuse = last_block_reuse(trace)
    dead = reuse < LAST_BLOCK_DEAD_BELOW
    count_from = int(len(train) * (1 - VALIDATION_FRACTION))
    hit = lambda policy: replay(train, tiers, policy, count_from=count_from,
                                trace=trace).result.token_hit_ratio
    sweep = [("lru", hit("lru"))]
    best, best_hit = None, sweep[0][1]
    for candidate in candidates:
        readout = Readout(candidate.kind, candidate.q, candidate.horizon_s, dead)
        ratio = hit(learned_factory(model, readout, signals, shadowed=False))
        sweep.append((readout.label(), ratio))
        if ratio > best_hit:
            best, best_hit = readout, ratio
    return Choice(model, best, tuple(sweep), reuse)
