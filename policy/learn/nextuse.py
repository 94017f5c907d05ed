"""When will a request's conversation come back? The learned next-use model, as plain data.

A block is reused when the next request of its conversation chain arrives. The model gives,
for the request that last used a block, the distribution of that arrival as known now:

* **finished** requests: with probability ``p`` (:attr:`NextUseModel.continuation`, trees on
  the finish row; else the class's rate) the chain continues after a gap ``s * g``, where
  ``s`` is a learned scale (:attr:`gap_scale`, trees predicting ln gap) and ``g`` is drawn
  from the normalised gaps of the request's finish class (:class:`GapTable`: after a tool
  call the agent comes straight back, after the end of a turn a person may take minutes);
* **running** requests (not finished yet, so their finish is unknown): the time from arrival
  to the next arrival, normalised by a scale from the arrival row, among training requests
  still running after the same normalised time (:class:`RunningTable`).

Conditioned on the time already waited, two readouts rank blocks (:data:`READOUTS`; computed
by the replay core and the engine plug-in, the per-row oracle is in ``tests/policy/learn/``). Everything here is numbers and trees (:mod:`kvtier.policy.learn.trees`) and
round-trips through JSON (:meth:`NextUseModel.to_json`); the engine plug-in reads that file.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.collector.events import FINISH_CLASSES
from kvtier.policy.learn.request_signals import FEATURES
from kvtier.policy.learn.trees import Trees

FINISH_COLUMN = FEATURES.index("finish_class")

QUANTILES = 64
VERSION = 1
READOUTS = ("next_use", "reuse_within")


@dataclass(frozen=True)
class GapTable:
    """Quantiles of normalised gaps of requests whose chain continued (sorted, evenly spaced
    in probability from 0 to 1), and the share that never continued."""

    quantiles: tuple[float, ...]
    never_fraction: float
    count: int

    def cdf(self, x: float) -> float:
        """P(gap <= x | continued), piecewise linear between quantiles."""
        q = self.quantiles
        if not q or x < q[0]:
            return 0.0
        if x >= q[-1]:
            return 1.0
        i = bisect.bisect_right(q, x) - 1
        lo, hi = q[i], q[i + 1]
        frac = (x - lo) / (hi - lo) if hi > lo else 1.0
        return (i + frac) / (len(q) - 1)

    def inverse(self, u: float) -> float:
        q = self.quantiles
        u = min(max(u, 0.0), 1.0) * (len(q) - 1)
        i = min(int(u), len(q) - 2)
        return q[i] + (u - i) * (q[i + 1] - q[i])

    @classmethod
    def of(cls, gaps: Sequence[float], never: int) -> GapTable:
        gaps = sorted(gaps)
        n = len(gaps)
        if n < 2:
            return cls((), 1.0 if never else 0.0, n)
        qs = tuple(gaps[round(k * (n - 1) / (QUANTILES - 1))] for k in range(QUANTILES))
        return cls(qs, never / (n + never), n)


@dataclass(frozen=True)
class RunningTable:
    """For normalised elapsed times ``elapsed[k]``: the table of remaining normalised time to
    the next arrival among training requests still running then."""

    elapsed: tuple[float, ...]
    tables: tuple[GapTable, ...]

    def at(self, e: float) -> GapTable | None:
        if not self.elapsed:
            return None
        k = max(0, bisect.bisect_right(self.elapsed, e) - 1)
        return self.tables[k]


@dataclass(frozen=True)
class Readout:
    """How a tier reads the model: ``next_use`` ranks by the ``q``-quantile of the time to
    the chain's next request (Belady's order, estimated), ``reuse_within`` by the chance it
    comes within ``horizon_s``; ``last_block_dead``: a prompt's last block counts as dead."""

    kind: str = "next_use"
    q: float = 0.5
    horizon_s: float = 100.0
    last_block_dead: bool = False

    def __post_init__(self) -> None:
        if self.kind not in READOUTS:
            raise ValueError(f"readout must be one of {', '.join(READOUTS)}, got {self.kind!r}")
        if not 0 < self.q < 1:
            raise ValueError(f"q must be in (0, 1), got {self.q!r}")
        if not self.horizon_s > 0:
            raise ValueError(f"horizon_s must be > 0, got {self.horizon_s!r}")

    def label(self) -> str:
        if self.kind == "next_use":
            return f"next_use q={self.q:g}"
        return f"reuse_within {self.horizon_s:g}s"


@dataclass(frozen=True)
class NextUseModel:
    classes: dict                     # finish class -> GapTable of gap / scale; "*" = all
    running: RunningTable
    continuation: Trees | None        # P(chain continues | finish row)
    gap_scale: Trees | None           # ln scale of the gap after finish | finish row
    arrival_scale: Trees | None       # ln scale of (next arrival - arrival) | arrival row
    models: dict                      # model name -> code used in the rows

    def table(self, finish_class: str) -> GapTable:
        t = self.classes.get(finish_class)
        return t if t is not None and len(t.quantiles) >= 2 else self.classes["*"]

    def finished_views(self, rows) -> tuple[list[GapTable], list[float], list[float]]:
        """(table, p, scale) of every finished request's row of ``rows`` (a requests x features
        float array, finish columns filled), as (tables, p, scales): the finish class's table, the
        continuation probability (else the class's rate) and the gap scale (else 1)."""
        tables = [self.table(FINISH_CLASSES[int(c)]) for c in rows[:, FINISH_COLUMN].tolist()]
        p = (self.continuation.predict_rows(rows) if self.continuation
             else [1.0 - t.never_fraction for t in tables])
        s = ([math.exp(x) for x in self.gap_scale.predict_rows(rows)] if self.gap_scale
             else [1.0] * len(tables))
        return tables, p, [max(x, 1e-3) for x in s]

    def arrival_scales(self, rows) -> list[float]:
        """The arrival scale of every row of ``rows`` (arrival columns read; 1 without trees)."""
        if not self.arrival_scale:
            return [1.0] * len(rows)
        width = len(self.arrival_scale.features)
        return [max(math.exp(x), 1e-3)
                for x in self.arrival_scale.predict_rows(rows[:, :width])]

    def to_json(self) -> dict:
        table = lambda t: {"quantiles": list(t.quantiles), "never_fraction": t.never_fraction,
                           "count": t.count}
        trees = lambda t: None if t is None else t.to_json()
        return {"kind": "kvtier-next-use", "version": VERSION,
                "classes": {k: table(t) for k, t in self.classes.items()},
                "running": {"elapsed": list(self.running.elapsed),
                            "tables": [table(t) for t in self.running.tables]},
                "continuation": trees(self.continuation), "gap_scale": trees(self.gap_scale),
                "arrival_scale": trees(self.arrival_scale), "models": dict(self.models)}

    @classmethod
    def from_json(cls, data: dict) -> NextUseModel:
        if not isinstance(data, dict) or data.get("kind") != "kvtier-next-use":
            raise ValueError("not a kvtier next-use model (kind must be 'kvtier-next-use')")
        if data.get("version") != VERSION:
            raise ValueError(f"next-use model version {data.get('version')!r} unsupported; "
                             f"this kvtier reads version {VERSION}")
        try:
            table = lambda t: GapTable(tuple(float(x) for x in t["quantiles"]),
                                       float(t["never_fraction"]), int(t["count"]))
            trees = lambda t: None if t is None else Trees.from_json(t)
            classes = {str(k): table(t) for k, t in data["classes"].items()}
            if "*" not in classes:
                raise ValueError("classes needs the '*' table")
            running = RunningTable(tuple(float(e) for e in data["running"]["elapsed"]),
                                   tuple(table(t) for t in data["running"]["tables"]))
            return cls(classes, running, trees(data["continuation"]), trees(data["gap_scale"]),
                       trees(data["arrival_scale"]),
                       {str(k): int(v) for k, v in data["models"].items()})
        except (KeyError, TypeError) as error:
            raise ValueError(f"next-use model is missing or mistypes {error}") from None
