"""The next-use model: gap tables, conditional readouts, fitting, JSON."""

import json
import math

import pytest

from kvtier.policy.learn.nextuse import GapTable, NextUseModel
from kvtier.policy.learn.nextuse_fit import fit_next_use
from tests.policy.learn import traffic
from tests.policy.learn.oracle_nextuse import next_use_s, reuse_within


def test_gap_table_cdf_and_inverse_agree():
    table = GapTable.of([float(x) for x in range(1, 101)], never=0)
    assert table.cdf(0.5) == 0.0 and table.cdf(100.0) == 1.0
    assert table.cdf(50.5) == pytest.approx(0.5, abs=0.02)
    for u in (0.1, 0.5, 0.9):
        assert table.cdf(table.inverse(u)) == pytest.approx(u, abs=1e-9)


def test_readouts_condition_on_the_time_already_waited():
    table = GapTable.of([10.0] * 50 + [1000.0] * 50, never=0)
    # fresh: even odds of coming back within a minute; after a minute, only the slow half is left
    assert reuse_within(table, 1.0, 1.0, 0.0, 60.0) == pytest.approx(0.5, abs=0.05)
    assert reuse_within(table, 1.0, 1.0, 60.0, 60.0) == pytest.approx(0.0, abs=0.02)
    assert next_use_s(table, 1.0, 1.0, 60.0, 0.5) == pytest.approx(940.0, rel=0.05)
    # a chain that probably never comes back has no finite next use at the median
    assert math.isinf(next_use_s(table, 0.3, 1.0, 0.0, 0.5))
    # a scale stretches time
    assert next_use_s(table, 1.0, 2.0, 120.0, 0.5) == pytest.approx(2 * 940.0, rel=0.05)


def test_fitted_model_learns_that_tool_calls_come_back_sooner_and_round_trips_json():
    records = traffic.agentic(sessions=40, seed=1)
    model = fit_next_use(records)
    assert model.table("tool_use").inverse(0.5) < model.table("end_turn").inverse(0.5)
    assert model.table("end_turn").never_fraction > model.table("tool_use").never_fraction
    again = NextUseModel.from_json(json.loads(json.dumps(model.to_json())))
    assert again == model


def test_a_file_that_is_not_a_model_is_a_clear_error():
    with pytest.raises(ValueError, match="not a kvtier next-use model"):
        NextUseModel.from_json({"kind": "something else"})
    with pytest.raises(ValueError, match="version 9 unsupported"):
        NextUseModel.from_json({"kind": "kvtier-next-use", "version": 9})
