"""The in-engine learned policy's state (standard library only) without vLLM, and the
signals its replay twin passes it. That the twin, in the simulator's vLLM flow, evicts what a
serving engine running the plug-in evicts is ``test_next_use_engine.py``."""

from __future__ import annotations

import json

import pytest

from kvtier.policy.learn.nextuse import Readout
from kvtier.probes.vllm import next_use_policy
from kvtier.probes.vllm.next_use_shadow import ShadowedNextUse
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


def test_the_shadow_follows_lru_by_request_until_the_learned_ghost_leads():
    """In LRU order a request's blocks are renewed when it ends, its first block last of
    all; a block stored with no request goes first; a pinned block is passed over."""
    state = ShadowedNextUse(lambda: next_use_policy.NextUseState(None), capacity=8)
    assert state.following == "lru"
    a = state.request("a", {"kvtier": {"arrival_s": 1.0}})
    state.used(a, 1, 0, True)
    state.used(a, 2, 1, True)
    state.finished("a")
    b = state.request("b", {"kvtier": {"arrival_s": 2.0}})
    state.used(b, 1, 0, False)  # loaded from the tier
    state.used(b, 3, 1, True)
    state.finished("b")
    state.orphan(4)
    assert state.order(3, lambda h: False) == [4, 2, 3]
    assert state.order(3, lambda h: h == 2) == [4, 3, 1]
    state.forget(4)
    assert state.order(1, lambda h: False) == [2] and state.resident() == 3
    # both ghosts were offered each request's blocks: b's block 1 was held by both
    assert state.scores["lru"] == state.scores["learned"] > 0 and state.switches == 0


def test_the_in_engine_shadow_keeps_a_losing_order_near_vllms_lru():
    """Agentic sessions whose next-use order, replayed in vLLM's flow, loses 5 points to
    vLLM's LRU on later time: behind its online shadow the plug-in's twin loses at most about
    one, following LRU while the learned ghost trails and the learned order while it leads."""
    from kvtier.policy.learn.replay import Tiers
    from kvtier.policy.learn.vllm_deploy import next_use_for_vllm
    from kvtier.probes.vllm.next_use_twin import NextUseTwin

    records, tiers = traffic.agentic(sessions=120, seed=0), Tiers(100, 300)
    twins = []

    def twin(pinned):
        def make(capacity, document):
            twins.append(NextUseTwin(capacity, document))
            if pinned:  # the learned order alone: its ghosts score, the tier never follows
                twins[-1].state.pin("learned")
            return twins[-1]
        return make

    alone = next_use_for_vllm(records, tiers, twin(True))
    shadowed = next_use_for_vllm(records, tiers, twin(False))
    assert alone.lru_hit_ratio == shadowed.lru_hit_ratio and alone.readout == shadowed.readout
    assert alone.learned_hit_ratio < alone.lru_hit_ratio - 0.03
    assert shadowed.learned_hit_ratio > alone.learned_hit_ratio + 0.02
    assert shadowed.learned_hit_ratio > shadowed.lru_hit_ratio - 0.015
    assert set(twins[1].orders) == {"lru", "learned"} and twins[1].state.switches >= 2
    assert set(twins[0].orders) == {"learned"}
    print("vLLM flow, later time:", {"lru": round(alone.lru_hit_ratio, 4),
                                     "learned alone": round(alone.learned_hit_ratio, 4),
                                     "behind the shadow": round(shadowed.learned_hit_ratio, 4),
                                     "switches": twins[1].state.switches})
