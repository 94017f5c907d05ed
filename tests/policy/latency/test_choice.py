"""Which latency model may promise: a failed held-out check is flagged, and where the model
knew no GPU KV capacity, the flag says which flag gives it."""

from __future__ import annotations

from kvtier.policy.cost import CostParams
from kvtier.policy.engine_model.batch_scheduler import SchedulerLimits
from kvtier.policy.engine_model.params import EngineModelParams
from kvtier.policy.latency.choice import choose


def held(ratio: float) -> dict:
    return {"by_tier_config": [{"tier_config_id": "gpu+cpu",
                                "ratio": {"ttft_p50_s": 1.0, "ttft_p95_s": ratio}}]}


def test_a_model_that_missed_names_the_miss_and_makes_no_engine_promise():
    engine = EngineModelParams(limits=SchedulerLimits(kv_blocks=160))
    choice = choose(CostParams(), engine, held(0.31), promotion_measured=True)
    assert choice.model is None or choice.model.name != "engine"
    assert choice.flag == "the engine model missed its held-out check: ttft p95 0.31x measured on gpu+cpu"


def test_a_model_blind_to_the_gpus_kv_capacity_is_told_how_to_give_it():
    choice = choose(CostParams(), EngineModelParams(), held(0.31), promotion_measured=True)
    assert choice.flag.startswith("the engine model missed its held-out check: ttft p95 0.31x")
    assert "given no GPU KV capacity" in choice.flag and "--gpu-blocks" in choice.flag
    fine = choose(CostParams(), EngineModelParams(), held(0.9), promotion_measured=True)
    assert fine.flag is None and fine.model.name == "engine"
