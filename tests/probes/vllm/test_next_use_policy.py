"""The in-engine learned policy's state (standard library only) without vLLM, and the
signals its replay twin passes it. That the twin, in the simulator's vLLM flow, evicts what a
serving engine running the plug-in evicts is ``test_next_use_engine.py``."""

from __future__ import annotations

import json

import pytest

from kvtier.policy.learn.nextuse import Readout
from kvtier.probes.vllm import next_use_policy
from kvtier.probes.vllm.next_use_twin import signals_of
from tests.policy.learn import traffic


def test_signals_carry_what_a_gateway_knows():
    (record,) = traffic.agentic(sessions=1, seed=0)[:1]
    signals = signals_of(record)
    assert signals["session_id"] == record.session_id and signals["arrival_s"] == 0.0
    assert signals["stop_reason"] in ("tool_use", "end_turn")


def test_a_block_no_request_announced_goes_first():
    state = next_use_policy.NextUseState(None)
    request = state.request("a", {"kvtier": {"arrival_s": 1.0}})
    state.used(request, 1, 0, True)
    state.used(request, 2, 1, True)
    state.finished("a")
    state.orphan(3)  # stored without its request (a store racing a cache reset)
    assert state.order(3, lambda h: False) == [3, 2, 1]
    state.forget(3)
    assert state.order(1, lambda h: False) == [2]


@pytest.mark.parametrize("readout", [Readout("next_use", q=0.7),
                                     Readout("reuse_within", horizon_s=60.0)],
                         ids=lambda r: r.label())
def test_the_engines_reader_ranks_as_the_trained_model(readout):
    """The plug-in reads the model file with the standard library; its views and readouts
    are the trained model's numbers (what the simulator's exclusive rows rank by)."""
    import math

    from kvtier.collector.events import FINISH_CLASSES
    from kvtier.policy.learn.deploy import deployment
    from tests.policy.learn.oracle_nextuse import finished_view, next_use_s, reuse_within
    from kvtier.policy.learn.nextuse_fit import fit_next_use
    from kvtier.policy.learn.signal_table import signal_table
    from kvtier.probes.vllm.next_use_model import NextUseReader

    records = traffic.agentic(sessions=60, seed=5)
    model = fit_next_use(records)
    reader = NextUseReader(json.loads(json.dumps(deployment(model, readout))))
    rows = signal_table(records, None, model.models).rows.tolist()
    finite = 0
    for i, row in enumerate(rows[::7]):
        table, p, scale = finished_view(model, FINISH_CLASSES[int(row[12])], row)
        view = reader.view(row)
        assert (view[1], view[2]) == (p, scale)
        waited = [0.0, 1.0, 30.0, 900.0][i % 4]
        expected = (next_use_s(table, p, scale, waited, readout.q) if readout.kind == "next_use"
                    else -reuse_within(table, p, scale, waited, readout.horizon_s))
        assert reader.rank(view, waited) == expected
        finite += math.isfinite(expected)
    assert finite > 20 and model.continuation is not None and model.gap_scale is not None
