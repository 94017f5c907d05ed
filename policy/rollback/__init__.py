"""The rollback rule (:mod:`kvtier.policy.rollback.rule`), its decision over request records
(:mod:`kvtier.policy.rollback.decide`), the same rule live, one evaluation at a time
(:mod:`kvtier.policy.rollback.live_rule`; its statistic and clock are
:mod:`kvtier.policy.rollback.window`'s, shared) and the Prometheus alert rules rendered from
it (:mod:`kvtier.policy.rollback.alerts`)."""

from kvtier.policy.rollback.rule import LatencyBudget

__all__ = ["LatencyBudget"]
