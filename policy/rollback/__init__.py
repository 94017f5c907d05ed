"""The rollback rule (:mod:`kvtier.policy.rollback.rule`), its decision over request records
(:mod:`kvtier.policy.rollback.decide`) and the Prometheus alert rules rendered from it
(:mod:`kvtier.policy.rollback.alerts`)."""

from kvtier.policy.rollback.rule import LatencyBudget

__all__ = ["LatencyBudget"]
