"""Train a :class:`~kvtier.policy.learn.nextuse.NextUseModel` on the training period of a trace.

Labels come from the training requests alone: a request's chain continued if a later
training request of its chain arrived (one after the training period is unknown then, and
counts as not continued, as it would have in production). Rows are the signal tracker's,
so what the model reads is what a policy can know (:mod:`kvtier.policy.learn.request_signals`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.nextuse import GapTable, NextUseModel, RunningTable
from kvtier.policy.learn.request_signals import ARRIVAL_FEATURES, FEATURES, finish_class
from kvtier.policy.learn.signal_table import SignalTable, signal_table
from kvtier.policy.learn.trees import Trees, export

RUNNING_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
MIN_ROWS = 200  # fewer training requests: no trees, class tables only
MIN_GAP_S = 0.5


@dataclass(frozen=True)
class FitConfig:
    seed: int = 0
    max_iter: int = 100
    learning_rate: float = 0.1
    max_leaf_nodes: int = 15
    min_samples_leaf: int = 50


def fit_next_use(records: Sequence[RequestRecord], signals: SignalTable | None = None,
                 config: FitConfig = FitConfig()) -> NextUseModel:
    """The model of the requests ``records`` (the training period); ``signals``: their
    :func:`~kvtier.policy.learn.signal_table.signal_table`, when the caller has it (its
    vocabulary is the model's)."""
    if not records:
        raise ValueError("need at least one training request")
    if signals is None:
        signals = signal_table(records)
    if len(signals) != len(records):
        raise ValueError(f"signals cover {len(signals)} requests, the records {len(records)}")
    models = signals.models
    n = len(records)
    rows = signals.rows
    arrival, finish, succ = signals.arrival_s, signals.finish_s, signals.successor
    continued = succ >= 0
    gap = np.where(continued, np.maximum(arrival[succ] - finish, MIN_GAP_S), np.inf)
    total = np.where(continued, np.maximum(arrival[succ] - arrival, MIN_GAP_S), np.inf)
    classes = [finish_class(r) for r in records]
    enough = n >= MIN_ROWS and continued.sum() >= MIN_ROWS // 4
    continuation = gap_scale = arrival_scale = None
    gs = as_ = np.ones(n)
    if enough and (~continued).sum() >= MIN_ROWS // 4:
        continuation, _ = _trees(config, rows, continued.astype(int), classify=True)
    if enough:
        gap_scale, fitted = _trees(config, rows[continued], np.log(gap[continued]))
        gs = _scales(fitted, rows)
        arrival_scale, fitted = _trees(config, rows[continued][:, :ARRIVAL_FEATURES],
                                       np.log(total[continued]))
        as_ = _scales(fitted, rows[:, :ARRIVAL_FEATURES])
    norm_gap = gap / gs
    tables = {"*": _table(norm_gap)}
    for name in sorted(set(classes)):
        mask = np.array([c == name for c in classes])
        tables[name] = _table(norm_gap[mask])
    e2e = (finish - arrival) / as_
    norm_total = total / as_
    running = []
    for e in RUNNING_GRID:
        still = e2e > e
        running.append(_table(norm_total[still] - e))
    return NextUseModel(tables, RunningTable(RUNNING_GRID, tuple(running)), continuation,
                        gap_scale, arrival_scale, models)


def _table(values: np.ndarray) -> GapTable:
    finite = values[np.isfinite(values)]
    return GapTable.of(finite.tolist(), int(len(values) - len(finite)))


def _scales(estimator, rows: np.ndarray) -> np.ndarray:
    # the estimator's own predictions: the exported trees give the same numbers
    return np.maximum(np.exp(estimator.predict(rows)), 1e-3)


def _trees(config: FitConfig, X: np.ndarray, y: np.ndarray, *, classify: bool = False
           ) -> tuple[Trees, object]:
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    cls = HistGradientBoostingClassifier if classify else HistGradientBoostingRegressor
    estimator = cls(max_iter=config.max_iter, learning_rate=config.learning_rate,
                    max_leaf_nodes=config.max_leaf_nodes,
                    min_samples_leaf=config.min_samples_leaf, random_state=config.seed)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # small fits: threads only contend (and on a busy host, badly)
        estimator.fit(X, y)
    return export(estimator, FEATURES[:X.shape[1]]), estimator
