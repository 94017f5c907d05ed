"""The rollback rule, live: one serving instance's requests as they finish, evaluated every
``step_s``, deciding when to pause the newest tier's loads and when to resume them.

The statistic and the clock are the recorded rule's (:mod:`kvtier.policy.rollback.window`):
at each evaluation instant ``t`` the p99 TTFT and ITL of the requests that finished in
``(t - window_s, t]``; a metric over its budget at every instant for ``sustained_s`` fires.
Live, a request is observed when it finishes (its record arrives then), where the recorded
rule windows requests by arrival.

A pause has to end when it is safe, and must not flap:

* hysteresis: a resume needs every p99 at or below ``resume_ratio`` times its budget at every
  instant for ``sustained_s``; an empty window is no evidence either way (an engine stuck on a
  slow tier finishes nothing), so a pause holds through silence;
* hold: a pause lasts at least ``hold_s``; a pause that comes within ``max_hold_s`` of the
  last resume holds twice as long as the one before (up to ``max_hold_s``).

The rule cannot see how fast a paused tier is (no request loads from it), so a resume is a
trial: a tier still slow breaches again, and pays one sustained breach per hold, a shrinking
share of the time as the holds double. Pure: observations and instants in, decisions out.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from kvtier.policy.rollback.rule import LatencyBudget
from kvtier.policy.rollback.window import Sustained, window_p99

MODES = ("off", "observe", "act")  # off: not evaluated; observe: decided and recorded only


@dataclass(frozen=True)
class GuardrailSettings:
    """How the live rule runs: ``mode`` (:data:`MODES`), the ``budget`` (its window and
    sustained interval), the evaluation interval ``step_s`` (Prometheus's), the hysteresis
    ``resume_ratio`` and the holds (seconds)."""

    mode: str = "observe"
    budget: LatencyBudget = LatencyBudget()
    step_s: float = 15.0
    resume_ratio: float = 0.8
    hold_s: float = 300.0
    max_hold_s: float = 3600.0
    max_observations: int = 200_000  # per instance: the newest kept

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("step_s", "hold_s", "max_hold_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.resume_ratio <= 1:
            raise ValueError(f"resume_ratio must be in (0, 1], got {self.resume_ratio!r}")
        if self.max_hold_s < self.hold_s:
            raise ValueError(f"max_hold_s {self.max_hold_s!r} is below hold_s {self.hold_s!r}")
        if self.max_observations < 1:
            raise ValueError(f"max_observations must be >= 1, got {self.max_observations!r}")


@dataclass(frozen=True)
class Decision:
    """A pause or a resume at ``time_s``: why (``ttft_p99_over_budget``,
    ``itl_p99_over_budget``, ``within_budget``), the window p99s it saw, the budget the
    breached one was held to, and for a pause how long it holds at least."""

    action: str
    time_s: float
    reason: str
    ttft_p99_s: float | None
    itl_p99_s: float | None
    budget_s: float | None = None
    hold_s: float | None = None


@dataclass(frozen=True)
class RuleStatus:
    """Where the rule stands: paused or not since ``since_s``, until when a pause holds at
    least, the last window p99s, and since when a breach (or, paused, the all-clear) has held."""

    paused: bool
    since_s: float | None
    hold_until_s: float | None
    ttft_p99_s: float | None
    itl_p99_s: float | None
    breaching_since_s: float | None
    clear_since_s: float | None


class LiveRule:
    """One instance's rule (see module doc). Not thread-safe: its owner serialises calls."""

    def __init__(self, settings: GuardrailSettings):
        self.settings = settings
        budget = settings.budget
        self._limits = {"ttft": budget.ttft_p99_s, "itl": budget.itl_p99_s}
        self._times: list[float] = []
        self._values: list[tuple[float, float]] = []  # (ttft, itl), NaN where absent
        self._over = {m: Sustained(budget.sustained_s) for m in self._limits}
        self._clear = Sustained(budget.sustained_s)
        self.paused = False
        self._since_s: float | None = None
        self._hold_s = settings.hold_s
        self._resumed_s: float | None = None
        self._p99: dict[str, float | None] = {"ttft": None, "itl": None}

    def observe(self, finished_s: float, ttft_s: float | None, itl_s: float | None) -> None:
        """A request that finished at ``finished_s`` (Unix seconds) with these latencies."""
        if ttft_s is None and itl_s is None:
            return
        at = bisect.bisect_right(self._times, finished_s)
        self._times.insert(at, finished_s)
        self._values.insert(at, (_nan(ttft_s), _nan(itl_s)))
        if len(self._times) > self.settings.max_observations:
            del self._times[0], self._values[0]

    def evaluate(self, now_s: float) -> Decision | None:
        """One evaluation instant: a pause, a resume, or ``None`` (no change)."""
        now_s = float(now_s)
        self._forget(now_s)
        self._p99 = {m: self._window(i, now_s) for i, m in enumerate(self._limits)}
        fired = [m for m in self._limits if self._over[m].update(
            now_s, self._over_budget(m), self._p99[m])]
        ratio = self.settings.resume_ratio
        seen = [(m, v) for m, v in self._p99.items() if v is not None]
        clear = bool(seen) and all(v <= ratio * self._limits[m] for m, v in seen)
        cleared = self._clear.update(now_s, clear)
        if not self.paused and fired:
            return self._pause(now_s, fired[0])
        if self.paused and cleared and now_s >= self._since_s + self._hold_s:
            return self._resume(now_s)
        return None

    def set_paused(self, paused: bool, now_s: float) -> None:
        """Adopt a state decided elsewhere (an operator's): its clocks start again."""
        if paused != self.paused:
            self.paused, self._since_s = paused, now_s
            self._resumed_s = None if paused else now_s
        self._reset_clocks()

    def status(self) -> RuleStatus:
        breaching = [o.since for o in self._over.values() if o.since is not None]
        hold_until = self._since_s + self._hold_s if self.paused else None
        return RuleStatus(self.paused, self._since_s, hold_until, self._p99["ttft"],
                          self._p99["itl"], min(breaching, default=None), self._clear.since)

    def _pause(self, now_s: float, metric: str) -> Decision:
        recent = self._resumed_s is not None and now_s - self._resumed_s < self.settings.max_hold_s
        self._hold_s = min(2 * self._hold_s, self.settings.max_hold_s) if recent else self.settings.hold_s
        self.paused, self._since_s = True, now_s
        self._reset_clocks()
        return Decision("pause", now_s, f"{metric}_p99_over_budget", self._p99["ttft"],
                        self._p99["itl"], self._limits[metric], self._hold_s)

    def _resume(self, now_s: float) -> Decision:
        self.paused, self._since_s, self._resumed_s = False, now_s, now_s
        self._reset_clocks()
        return Decision("resume", now_s, "within_budget", self._p99["ttft"], self._p99["itl"])

    def _reset_clocks(self) -> None:
        for clock in (*self._over.values(), self._clear):
            clock.reset()

    def _over_budget(self, metric: str) -> bool:
        value = self._p99[metric]
        return value is not None and value > self._limits[metric]

    def _window(self, column: int, now_s: float) -> float | None:
        values = np.asarray([v[column] for v in self._values], dtype=float)
        known = ~np.isnan(values)
        return window_p99(np.asarray(self._times)[known], values[known], now_s,
                          self.settings.budget.window_s)

    def _forget(self, now_s: float) -> None:
        """Observations older than every window still to come are of no more use."""
        cut = bisect.bisect_right(self._times, now_s - self.settings.budget.window_s)
        del self._times[:cut], self._values[:cut]


def _nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)
