"""The learned next-use model as the engine reads it: the JSON file, with the standard library.

The file is ``{"model": ..., "readout": ...}`` as ``kvtier recommend --next-use-policy``
writes it (``policy/learn/nextuse.py``'s :meth:`NextUseModel.to_json` and the readout of
``policy/learn/nextuse_tier.py``): per finish class a table of 64 quantiles of the
normalised gap to the chain's next request, and gradient-boosted trees (node lists) for the
continuation probability and the gap's scale. :class:`NextUseReader` gives, per finished
request, its table, probability and scale (:meth:`~NextUseReader.view`: each tree once), and
the readout at a time waited (:meth:`~NextUseReader.rank`: two bisections), the same
arithmetic as ``policy/learn/nextuse.py`` (a test holds them to the same decisions).
"""

from __future__ import annotations

import bisect
import math

from kvtier.collector.events import FINISH_CLASSES

class _Table:
    def __init__(self, t: dict) -> None:
        self.q = [float(x) for x in t["quantiles"]]
        self.never = float(t["never_fraction"])

    def cdf(self, x: float) -> float:
        q = self.q
        if not q or x < q[0]:
            return 0.0
        if x >= q[-1]:
            return 1.0
        i = bisect.bisect_right(q, x) - 1
        lo, hi = q[i], q[i + 1]
        return (i + ((x - lo) / (hi - lo) if hi > lo else 1.0)) / (len(q) - 1)

    def inverse(self, u: float) -> float:
        q = self.q
        u = min(max(u, 0.0), 1.0) * (len(q) - 1)
        i = min(int(u), len(q) - 2)
        return q[i] + (u - i) * (q[i + 1] - q[i])


class _Trees:
    def __init__(self, t: dict) -> None:
        self.probability = t["kind"] == "probability"
        self.baseline = float(t["baseline"])
        self.trees = [[tuple(node) for node in nodes] for nodes in t["trees"]]

    def predict(self, row) -> float:
        total = self.baseline
        for nodes in self.trees:
            i = 0
            while True:
                feature, threshold, nan_left, left, right, value = nodes[i]
                if feature < 0:
                    total += value
                    break
                x = row[feature]
                i = (left if nan_left else right) if x != x else (
                    left if x <= threshold else right)
        if not self.probability:
            return total
        return 1.0 / (1.0 + math.exp(-total)) if total > -700 else 0.0


class NextUseReader:
    def __init__(self, doc: dict) -> None:
        model, readout = doc["model"], doc["readout"]
        if model.get("kind") != "kvtier-next-use" or model.get("version") != 1:
            raise ValueError("not a kvtier next-use model (kind 'kvtier-next-use', version 1)")
        self.tables = {k: _Table(t) for k, t in model["classes"].items()}
        trees = lambda t: None if t is None else _Trees(t)
        self.continuation = trees(model["continuation"])
        self.gap_scale = trees(model["gap_scale"])
        self.models = {str(k): int(v) for k, v in model["models"].items()}
        self.kind = readout["kind"]
        self.q, self.horizon_s = float(readout["q"]), float(readout["horizon_s"])
        self.last_block_dead = bool(readout["last_block_dead"])

    def view(self, row) -> tuple:
        """(table, p, scale) of a finished request's row: the trees, once per request."""
        table = self.tables.get(FINISH_CLASSES[int(row[12])])
        if table is None or len(table.q) < 2:
            table = self.tables["*"]
        p = self.continuation.predict(row) if self.continuation else 1.0 - table.never
        s = max(math.exp(self.gap_scale.predict(row)), 1e-3) if self.gap_scale else 1.0
        return table, p, s

    def rank(self, view: tuple, waited_s: float) -> float:
        """Larger goes first (the readout of ``kvtier.policy.learn.nextuse``): two table look-ups."""
        table, p, s = view
        e = waited_s / s
        f0 = table.cdf(e)
        survive = 1.0 - p * f0
        if self.kind == "next_use":
            if survive <= 1e-12:
                return 0.0
            target = f0 + self.q * survive / p if p > 0 else math.inf
            return math.inf if target > 1.0 else s * max(0.0, table.inverse(target) - e)
        if survive <= 1e-12:
            return -1.0
        return -p * (table.cdf(e + self.horizon_s / s) - f0) / survive
