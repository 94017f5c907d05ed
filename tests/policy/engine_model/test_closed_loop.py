"""Closed-loop clients: each request chained to the one its client waited for, and replayed
after that request's predicted end instead of at its recorded time."""

from __future__ import annotations

import pytest

from kvtier.collector.events import RequestRecord
from kvtier.policy.engine_model.closed_loop import client_chains, engine_requests
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.engine_model.step_cost import StepCost
from kvtier.policy.engine_model.step_replay import replay


def record(name: str, arrival_s: float, e2e_s: float) -> RequestRecord:
    return RequestRecord(name, arrival_s, 10, output_tokens=1, recomputed_tokens=10,
                         ttft_s=e2e_s, e2e_latency_s=e2e_s)


def test_two_clients_chain_their_own_requests():
    # client 1: a (0-1), c (1.01-2); client 2: b (0.5-1.5), d (1.52-3); e arrives long after
    records = [record("a", 0.0, 1.0), record("b", 0.5, 1.0), record("c", 1.01, 1.0),
               record("d", 1.52, 1.5), record("e", 10.0, 1.0)]
    follows, think = client_chains(records)
    assert follows.tolist() == [0, 1, 0, 1, 4]
    assert think[2] == pytest.approx(0.01) and think[3] == pytest.approx(0.02)


def test_a_chained_request_is_sent_after_its_predecessors_predicted_end():
    # recorded: b sent 0.01 s after a ended at 1 s; the model serves a in 3 s, so b comes at 3.01
    records = [record("a", 0.0, 1.0), record("b", 1.01, 1.0)]
    requests = engine_requests(records, "closed")
    result = replay(requests, EngineModelParams(StepCost(overhead_s=3.0)))
    assert result.e2e_s.tolist() == pytest.approx([3.0, 3.0])  # b did not queue behind a
    open_loop = replay(engine_requests(records, "open"), EngineModelParams(StepCost(overhead_s=3.0)))
    assert open_loop.ttft_s[1] == pytest.approx(6.0 - 1.01)


def test_auto_keeps_open_loop_traffic_open():
    records = [record(f"r{i}", i * 5.0, 1.0) for i in range(10)]  # nobody waits for anybody
    assert engine_requests(records, "auto").follows is None
    with pytest.raises(ValueError, match="arrivals must be one of"):
        engine_requests(records, "sometimes")


def test_new_clients_starting_together_follow_the_request_their_companion_waited_for():
    # a load generator at concurrency 1 (a, b), then at concurrency 2: c and d sent together
    # once b ended; only c can claim b's end. d follows b too: replayed on a faster engine, it
    # comes with c (after b's predicted end), not at its recorded time
    records = [record("a", 0.0, 1.0), record("b", 1.01, 1.0), record("c", 2.02, 1.0),
               record("d", 2.03, 1.0)]
    follows, think = client_chains(records)
    assert follows.tolist() == [0, 0, 1, 1]
    assert think[3] == pytest.approx(0.02)
    late = [record("a", 0.0, 1.0), record("b", 1.01, 1.0), record("c", 2.02, 1.0),
            record("d", 2.2, 1.0)]  # d sent on its own, later: a client of its own
    assert client_chains(late)[0].tolist() == [0, 0, 1, 3]
