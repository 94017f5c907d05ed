"""Request signals: how a request ended, its chain, and that no row reads the future."""

import dataclasses
import math

import pytest

from kvtier.collector.events import RequestRecord
from kvtier.policy.learn.request_signals import ARRIVAL_FEATURES, FEATURES, SignalTracker, finish_class
from tests.policy.learn import traffic
from tests.policy.learn.synthetic import record


@pytest.mark.parametrize(("status", "reason", "expected"), [
    ("stopped", "tool_use", "tool_use"), ("stopped", "tool_calls", "tool_use"),
    ("stopped", "end_turn", "end_turn"), ("stopped", "stop", "end_turn"),
    ("length", "max_tokens", "length"), ("aborted", None, "aborted"), ("error", None, "aborted"),
    ("stopped", "42", "stopped"), (None, None, "unknown")])
def test_finish_class_names_what_happens_next(status, reason, expected):
    assert finish_class(record(0, (1,), finish_status=status, stop_reason=reason)) == expected


def rows_until(records, last, at_s):
    tracker = SignalTracker({"m": 0})
    for i, r in enumerate(records[:last + 1]):
        tracker.observe(i, r, r.block_hashes)
    return tracker, [tracker.features(i, at_s) for i in range(last + 1)]


def test_no_row_reads_the_future():
    records = traffic.agentic(sessions=8, seed=3)
    k = len(records) // 2
    now = records[k].arrival_s
    _, before = rows_until(records, k, now)
    # rewrite everything after request k: other finishes, latencies, sessions, blocks
    future = [dataclasses.replace(r, stop_reason="end_turn", e2e_latency_s=999.0,
                                  output_tokens=1, session_id="x", block_hashes=(7, 8))
              for r in records[k + 1:]]
    _, after = rows_until(records[:k + 1] + future, k, now)
    assert [[x if not math.isnan(x) else None for x in row] for row in before] == \
           [[x if not math.isnan(x) else None for x in row] for row in after]


def test_how_a_request_ended_is_hidden_until_it_finished():
    r = record(0, (1, 2), t=10.0, finish_status="stopped", stop_reason="tool_use",
               e2e_latency_s=5.0, session_id="s")
    tracker = SignalTracker()
    tracker.observe(0, r, r.block_hashes)
    running = tracker.features(0, 14.9)
    assert all(math.isnan(x) for x in running[ARRIVAL_FEATURES:])
    assert not any(math.isnan(x) for x in running[:ARRIVAL_FEATURES])
    done = tracker.features(0, 15.0)
    assert done[FEATURES.index("finish_class")] == 0.0  # tool_use
    assert not tracker.finished(0, 14.9) and tracker.finished(0, 15.0)


def test_chat_turns_join_one_chain_without_session_ids():
    first = record(0, (0, 1, 2, 3), t=0.0)
    second = record(1, (0, 1, 2, 5, 6), t=60.0)   # re-sends all but the partial last block
    other = record(2, (0, 9, 10), t=61.0)         # shares only the system prompt
    tracker = SignalTracker()
    for i, r in enumerate((first, second, other)):
        tracker.observe(i, r, r.block_hashes)
    chains = [tracker.requests[i].chain for i in range(3)]
    assert chains[0] == chains[1] != chains[2]
    assert tracker.superseded(0) and not tracker.superseded(1)
    assert tracker.features(1, 61.0)[FEATURES.index("chain_depth")] == 1.0


def test_sub_agents_have_their_own_chain_under_their_parent():
    main = record(0, (1, 2), session_id="c", request_type="main")
    sub = record(1, (7,), t=1.0, session_id="c", request_type="subagent", parent_request_id="r0")
    again = record(2, (1, 2, 3), t=2.0, session_id="c", request_type="main")
    tracker = SignalTracker()
    for i, r in enumerate((main, sub, again)):
        tracker.observe(i, r, r.block_hashes)
    assert tracker.successor == {0: 2}
    assert tracker.requests[1].chain != tracker.requests[0].chain


@pytest.mark.parametrize("records", [traffic.agentic(sessions=30, seed=4),   # sessions
                                     traffic.chat(hours=0.1, seed=6)],       # none: block walk
                         ids=["sessions", "no-sessions"])
def test_the_signal_table_is_what_the_tracker_knows_of_each_request(records):
    from kvtier.policy.learn.signal_table import signal_table, vocabulary

    tracker = SignalTracker(vocabulary(records))
    for i, r in enumerate(records):
        tracker.observe(i, r, r.block_hashes)
    table = signal_table(records)
    n = len(records)
    assert table.rows.tolist() == [tracker.features(i, math.inf) for i in range(n)]
    assert table.successor.tolist() == [tracker.successor.get(i, -1) for i in range(n)]
    assert table.finish_s.tolist() == [tracker.requests[i].finish_s for i in range(n)]
    assert table.blocks.tolist() == [len(r.block_hashes) for r in records]
    assert (table.successor >= 0).sum() > n // 10   # chains were found, with or without ids
