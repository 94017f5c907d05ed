"""Every request's signals at once: what :class:`~kvtier.policy.learn.request_signals.SignalTracker`
knows of each request, as arrays, built once per trace.

The next-use model trains on these rows, and the compiled next-use order reads them by
request index while it replays the same requests: a row's finish columns are there from the
start, and the order reads them only once the request has finished, as the tracker does; a
request's successor is read only once it has arrived. The walk over blocks that finds the
chat a request without a session id continues is done in the learned kernels
(``deepest_seen``), so building the table costs per request, not per block.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.request_signals import FEATURES, SignalTracker
from kvtier.policy.learn.kernels import kernels
from kvtier.policy.sim.trace import BlockTrace


@dataclass(frozen=True, eq=False)
class SignalTable:
    """Per request, in arrival order: ``arrival_s``, ``finish_s`` (arrival plus latency),
    ``successor`` (the next request of its chain, -1: none), ``blocks`` (its block count),
    ``block_tokens`` (its block size, 16 when the trace gives none), ``rows`` (its
    :data:`~kvtier.policy.learn.request_signals.FEATURES`, finish columns filled in) and ``models``
    (the model vocabulary the rows were coded with)."""

    arrival_s: np.ndarray
    finish_s: np.ndarray
    successor: np.ndarray
    blocks: np.ndarray
    block_tokens: np.ndarray
    rows: np.ndarray
    models: dict

    def __len__(self) -> int:
        return len(self.arrival_s)


def vocabulary(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Model names -> codes, most requested first (what the rows' ``model_code`` reads)."""
    counts = Counter(r.model for r in records if r.model)
    return {name: code for code, (name, _) in enumerate(counts.most_common())}


def signal_table(records: Sequence[RequestRecord], trace: BlockTrace | None = None,
                 models: dict[str, int] | None = None) -> SignalTable:
    """The table of ``records`` (``trace``: their blocks as arrays, when the caller has them;
    ``models``: the vocabulary, default :func:`vocabulary` of ``records``)."""
    if trace is None:
        trace = BlockTrace.from_records(records)
    if len(trace) != len(records):
        raise ValueError(f"the trace has {len(trace)} requests, the records {len(records)}")
    models = vocabulary(records) if models is None else dict(models)
    owners, positions = kernels().deepest_seen(trace.hashes, trace.offsets)
    counts = np.diff(trace.offsets).tolist()
    tracker = SignalTracker(models)
    for i, record in enumerate(records):
        owner = int(owners[i])
        tracker.observe_counted(i, record, counts[i],
                                (owner, int(positions[i])) if owner >= 0 else None)
    n = len(records)
    requests = [tracker.requests[i] for i in range(n)]
    successor = np.full(n, -1, dtype=np.int64)
    if tracker.successor:
        successor[np.fromiter(tracker.successor.keys(), dtype=np.int64)] = np.fromiter(
            tracker.successor.values(), dtype=np.int64)
    rows = np.array([r.row for r in requests], dtype=np.float64).reshape(n, len(FEATURES))
    return SignalTable(
        np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=n),
        np.fromiter((r.finish_s for r in requests), dtype=np.float64, count=n),
        successor, np.asarray(counts, dtype=np.int64).reshape(n),
        np.fromiter((r.block_size_tokens or 16 for r in records), dtype=np.int64, count=n),
        rows, models)
