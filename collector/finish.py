"""How a request ended, as a policy reads it: the :data:`FINISH_CLASSES` of a request record's
``finish_status`` and ``stop_reason``. Standard library only: engines' plug-ins call it too;
:mod:`kvtier.collector.events` exports the same names."""

from __future__ import annotations

# What a policy reads from how a request ended (finish_class): a tool call (the agent comes
# straight back), the end of a turn (a person answers, or nobody), cut at the length limit,
# some other stop, aborted or failed, or not said.
FINISH_CLASSES = ("tool_use", "end_turn", "length", "stopped", "aborted", "unknown")
END_TURN_REASONS = ("end_turn", "stop_sequence", "stop")  # a turn handed back to the user


def finish_class(finish_status: str | None, stop_reason: str | None) -> str:
    """The :data:`FINISH_CLASSES` entry of a request that ended with ``finish_status`` (one of
    ``events.FINISH_STATUSES`` or ``None``) and ``stop_reason`` (a trace's ``tool_use`` /
    ``end_turn``, an engine's stop string, or ``None``)."""
    reason = (stop_reason or "").lower()
    if finish_status in ("aborted", "error"):
        return "aborted"
    if finish_status == "length":
        return "length"
    if reason in ("tool_use", "tool_calls"):
        return "tool_use"
    if reason in END_TURN_REASONS:
        return "end_turn"
    return "stopped" if finish_status == "stopped" or reason else "unknown"
