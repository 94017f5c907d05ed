"""Closed-loop clients in recorded traffic: who waited for whom.

A load generator with N clients (kvtier's load probe, a benchmark client) sends a client's
next request when its last one ends. Replayed at the recorded arrival times, such traffic
misleads: an engine model a little slower than the engine piles up a queue the clients would
never have built. So each request is chained to the request it waited for: the unclaimed
request that ended latest before it arrived, at most ``max_think_s`` before; it is then
replayed ``think_s`` (the recorded gap) after that request's predicted end.

A request that finds no end to claim but arrives within ``max_think_s`` after a chained one
(a load generator starting more clients at once, as kvtier's load probe does at each new
concurrency level, once the last level has drained) follows the same request as that one:
it was sent on the same event. Left at its recorded time, it would arrive when the
recorded, not the predicted, engine got there (a faster tier configuration reaches the
level earlier, and its new clients then seem to come late: the reference engine with a CPU
tier, TTFT p95 predicted at 0.57x of measured instead of 1.13x).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvtier.collector.events import RequestRecord
from kvtier.policy.engine_model.step_replay import EngineRequests

ARRIVALS = ("auto", "open", "closed")
MAX_THINK_S = 0.05
CLOSED_SHARE = 0.8  # auto: closed loop when this share of requests after the first is chained


def client_chains(records: Sequence[RequestRecord], max_think_s: float = MAX_THINK_S
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(follows, think_s)`` for records in arrival order: ``follows[i]`` the request that
    request ``i`` waited for (``i`` itself for none), ``think_s[i]`` the gap after its end."""
    n = len(records)
    follows, think = np.arange(n), np.zeros(n)
    ended: list[tuple[float, int]] = []  # (end, request), not yet claimed
    end_of: dict[int, float] = {}
    last_chained = -1  # the latest request so far that waited for another
    for i, record in enumerate(records):
        ended = [(end, j) for end, j in ended if end >= record.arrival_s - max_think_s]
        before = [(end, j) for end, j in ended if end <= record.arrival_s]
        if before:
            end, j = max(before)
            ended.remove((end, j))
            follows[i], think[i] = j, record.arrival_s - end
            last_chained = i
        elif last_chained >= 0 and record.arrival_s - records[last_chained].arrival_s <= max_think_s:
            j = int(follows[last_chained])  # sent on the same event as that request
            follows[i], think[i] = j, record.arrival_s - end_of[j]
        if record.e2e_latency_s is not None:
            end_of[i] = record.arrival_s + record.e2e_latency_s
            ended.append((end_of[i], i))
    return follows, think


def arrivals_of(records: Sequence[RequestRecord], arrivals: str = "auto") -> str:
    """``open`` or ``closed`` for ``records`` (arrival order): as given, or, for ``auto``,
    closed when :data:`CLOSED_SHARE` of the requests after the first chain
    (:func:`client_chains`)."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if arrivals != "auto":
        return arrivals
    if len(records) < 2:
        return "open"
    follows, _ = client_chains(records)
    chained = float(np.mean(follows[1:] != np.arange(1, len(records))))
    return "closed" if chained >= CLOSED_SHARE else "open"


def engine_requests(records: Sequence[RequestRecord], arrivals: str = "auto") -> EngineRequests:
    """``records`` (in arrival order) as the replay's requests: open loop, closed loop
    (:func:`client_chains`), or ``auto`` (:func:`arrivals_of`)."""
    requests = EngineRequests.from_records(records)
    if arrivals_of(records, arrivals) == "open" or len(records) < 2:
        return requests
    return requests.closed_loop(*client_chains(records))

