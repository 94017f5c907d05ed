"""The guardrail's series on the collector's ``/metrics`` (computed at scrape time):

=============================================  =====================================================
``kvtier_guardrail_state``                     1 while the guardrail holds a tier's loads or stores
                                               paused (in ``observe`` mode: would hold), by
                                               ``engine_instance``, ``tier``, ``direction``, ``mode``
``kvtier_guardrail_engine_state``              1 while the engines' newest request says they ran it
                                               paused (what they applied)
``kvtier_guardrail_actions_total``             moves by ``actor`` (rule, operator, engine), ``action``,
                                               ``direction``, ``reason``, ``mode``
``kvtier_guardrail_fallbacks_total``           requests whose tier-held prefix was recomputed, by
                                               ``reason`` (``paused``, ``queue``)
``kvtier_guardrail_fallback_tokens_total``     their tokens
``kvtier_guardrail_window_p99_seconds``        the p99 the rule last saw, by ``metric`` (ttft, itl)
``kvtier_guardrail_budget_seconds``            the budget it holds it to, by ``metric``
=============================================  =====================================================

The engines' count of control messages they dropped is the hooks tap's
(``kvtier_guardrail_rejected_messages_total``).
"""

from __future__ import annotations

from kvtier.collector.control import DIRECTIONS
from kvtier.collector.exports.prometheus import Sample


def guardrail_samples(guardrail):
    """Every series above, for :class:`kvtier.guardrail.watch.Guardrail` ``guardrail``."""
    budget = guardrail.config.settings.budget
    for metric, value in (("ttft", budget.ttft_p99_s), ("itl", budget.itl_p99_s)):
        yield Sample("kvtier_guardrail_budget_seconds", "The p99 budget the guardrail holds each "
                     "instance to", value, {"metric": metric, "mode": guardrail.mode})
    for watch in guardrail.watches():
        yield from _instance_samples(guardrail, watch)


def _instance_samples(guardrail, watch):
    base = {"engine": watch.engine, "engine_instance": watch.instance}
    tier = watch.tier(guardrail.config.tier)
    if tier is not None:
        for direction in DIRECTIONS:
            labels = {**base, "tier": tier, "direction": direction}
            yield Sample("kvtier_guardrail_state", "1 while the guardrail holds the tier's loads "
                         "or stores paused (observe mode: would hold)",
                         float((direction, tier) in watch.commanded),
                         {**labels, "mode": guardrail.mode})
            yield Sample("kvtier_guardrail_engine_state", "1 while the engines' newest request "
                         "ran with the tier's loads or stores paused",
                         float((direction, tier) in watch.engine_paused), labels)
    for (actor, action, direction, reason, mode), count in sorted(watch.actions.items()):
        yield Sample("kvtier_guardrail_actions_total", "Tier moves: the rule's decisions, an "
                     "operator's commands, what the engines applied", count,
                     {**base, "actor": actor, "action": action, "direction": direction,
                      "reason": reason, "mode": mode})
    for reason, count in sorted(watch.fallbacks.items()):
        labels = {**base, "reason": reason}
        yield Sample("kvtier_guardrail_fallbacks_total", "Requests whose tier-held prefix was "
                     "recomputed instead of loaded", count, labels)
        yield Sample("kvtier_guardrail_fallback_tokens_total", "Their prompt tokens",
                     watch.fallback_tokens[reason], labels)
    status = watch.rule.status()
    for metric, value in (("ttft", status.ttft_p99_s), ("itl", status.itl_p99_s)):
        if value is not None:
            yield Sample("kvtier_guardrail_window_p99_seconds", "The window p99 the rule last "
                         "saw", value, {**base, "metric": metric})
