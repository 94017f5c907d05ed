"""The rollback rule's statistic and its clock, shared by every place that applies the rule:
the p99 of a window of observations, and how long a condition has held at every evaluation
instant (Prometheus's ``for:``).

:func:`kvtier.policy.rollback.decide.decide` runs them over a recorded rollout;
:class:`kvtier.policy.rollback.live_rule.LiveRule` one evaluation at a time, as requests
finish.
"""

from __future__ import annotations

import numpy as np


def window_p99(times: np.ndarray, values: np.ndarray, t: float, window_s: float) -> float | None:
    """The p99 of the ``values`` whose ``times`` (sorted) fall in ``(t - window_s, t]``;
    ``None`` for an empty window (``rate()`` over no samples yields nothing: not a breach)."""
    lo, hi = np.searchsorted(times, [t - window_s, t], side="right")
    return float(np.percentile(values[lo:hi], 99)) if hi > lo else None


class Sustained:
    """Whether a condition has held at every evaluation instant for ``sustained_s``: the
    first instant it held (``since``) and the worst value seen meanwhile (``worst``). An
    instant it does not hold starts the clock again."""

    def __init__(self, sustained_s: float):
        self.sustained_s = sustained_s
        self.since: float | None = None
        self.worst: float | None = None

    def update(self, t: float, holds: bool, value: float | None = None) -> bool:
        """Record instant ``t``; ``True`` once the condition has held from ``since`` for at
        least ``sustained_s``."""
        if not holds:
            self.reset()
            return False
        self.since = t if self.since is None else self.since
        if value is not None:
            self.worst = value if self.worst is None else max(self.worst, value)
        return t - self.since >= self.sustained_s

    def reset(self) -> None:
        self.since = self.worst = None
