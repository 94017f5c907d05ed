"""The rollback rule (:mod:`policy.rollback.rule`), its decision over request records
(:mod:`policy.rollback.decide`) and the Prometheus alert rules rendered from it
(:mod:`policy.rollback.alerts`)."""

from policy.rollback.rule import LatencyBudget

__all__ = ["LatencyBudget"]
