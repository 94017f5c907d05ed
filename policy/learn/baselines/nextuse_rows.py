"""``kvtier evaluate``'s rows for the learned next-use order and its shadowed form, chosen on
the training period only (what ``recommended`` deploys is chosen among admission and eviction
pairs: :mod:`kvtier.policy.learn.pairs`).

* ``learned-next-use``: the learned order alone, with the readout that did best on the
  training period's latest slice (even if LRU did better there);
* ``learned-safe``: the same order inside its LRU shadow (:mod:`kvtier.policy.learn.shadowed`).
"""

from __future__ import annotations

from dataclasses import asdict

from kvtier.policy.learn.deploy import Choice, choose, learned_factory
from kvtier.policy.learn.replay import Tiers
from kvtier.policy.learn.split import Split

NEXT_USE = "learned-next-use"
SAFE = "learned-safe"
NAMES = (NEXT_USE, SAFE)


class ChoiceCache:
    """One model fit and readout sweep per evaluation, shared by the two rows."""

    def __init__(self, split: Split, tiers: Tiers, seed: int = 0, *, importance: bool = False) -> None:
        self.split, self.tiers, self.seed = split, tiers, seed
        self.with_importance = importance
        self._choice: Choice | None = None
        self._importance = None
        self._signals = None

    def get(self) -> Choice:
        if self._choice is None:
            from kvtier.policy.learn.nextuse_fit import FitConfig

            self._choice = choose(self.split.train, self.tiers, trace=self.split.train_trace,
                                  config=FitConfig(seed=self.seed))
        return self._choice

    def signals(self):
        """The evaluated records' signal table, coded with the model's vocabulary."""
        if self._signals is None:
            from kvtier.policy.learn.signal_table import signal_table

            self._signals = signal_table(self.split.records, self.split.trace,
                                         self.get().model.models)
        return self._signals

    def importance(self) -> dict:
        """The model's permutation importance on the evaluated (later) requests."""
        if self._importance is None:
            import numpy as np

            from kvtier.policy.learn.importance import importance

            self._importance = importance(self.get().model, self.split, self.signals(),
                                          rng=np.random.default_rng(self.seed)).to_json()
        return self._importance


def policy_for(name: str, cache: ChoiceCache):
    """(CPU policy for :func:`kvtier.policy.learn.replay.replay`, summary dict, shadow holder)."""
    choice = cache.get()
    best = choice.readout or _best_learned(choice)
    summary = {"readout": best.label(), "chosen_on": "training period's latest slice",
               "sweep": [list(p) for p in choice.sweep],
               "last_block_reuse": choice.last_block_reuse, "model": card(choice)}
    if cache.with_importance:
        summary["importance_later"] = cache.importance()
    built: list = []
    factory = learned_factory(choice.model, best, cache.signals(), shadowed=name != NEXT_USE)
    summary["deploys"] = ("learned next-use order behind its LRU shadow" if name != NEXT_USE
                          else "learned next-use order alone")
    return (lambda capacity: built.append(factory(capacity)) or built[-1]), summary, built


def shadow_summary(built: list) -> dict | None:
    """The shadowing statistics of the tier a replay built, if it was shadowed."""
    if not built or not hasattr(built[-1], "stats"):
        return None
    return asdict(built[-1].stats())


def _best_learned(choice: Choice):
    from kvtier.policy.learn.deploy import READOUT_CANDIDATES
    from kvtier.policy.learn.nextuse import Readout

    learned = [(hit, label) for label, hit in choice.sweep[1:]]
    label = max(learned)[1] if learned else None
    dead = choice.last_block_reuse < 0.1
    for candidate in READOUT_CANDIDATES:
        readout = Readout(candidate.kind, candidate.q, candidate.horizon_s, dead)
        if readout.label() == label:
            return readout
    return Readout(last_block_dead=dead)


def card(choice: Choice) -> dict:
    """What the model holds, in numbers a person can read."""
    model = choice.model
    trees = {name: (None if t is None else len(t.trees))
             for name, t in (("continuation", model.continuation),
                             ("gap_scale", model.gap_scale),
                             ("arrival_scale", model.arrival_scale))}
    return {"classes": {k: {"continued": t.count, "never_fraction": round(t.never_fraction, 4),
                            "median_normalised_gap": (t.inverse(0.5) if len(t.quantiles) > 1
                                                      else None)}
                        for k, t in model.classes.items()},
            "trees": trees, "models": len(model.models)}
