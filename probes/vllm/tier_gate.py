"""The guardrail inside vLLM's scheduler: which tiers the engine may load from and store into
now, and, per request, whether to load its prefix or recompute it. Free of vLLM types: the
connector (``probes/vllm/connector.py``) calls it from its scheduler hooks.

The state comes from the control receiver's thread (``collector/control_receiver.py``), and
is taken at step boundaries only (:meth:`TierGate.step`, from ``build_connector_meta``), so a
step never sees it change halfway. Each change is recorded as a ``TierMove`` of the engine
(``actor="engine"``, reason ``command`` or ``lease_expired``), and the requests admitted after
it carry the new tier configuration (``collector/control.py``'s ``tier_config_label``).

Per request (:meth:`TierGate.recompute_reason`, when the scheduler asks how many tokens the
tiers hold): recompute the external prefix instead of loading it when

* its tier's loads are paused (``paused``): loads from the CPU tier paused stop every external
  load (a cold block is staged through the CPU tier); loads from the cold tier paused stop a
  prefix a cold block is part of;
* in ``act`` mode with calibrated link costs, the load's expected wait, the load jobs and
  bytes queued ahead of it and its own, exceeds recomputing its tokens (``queue``).
"""

from __future__ import annotations

import time
from typing import Callable

from kvtier.collector.control import tier_config_label
from kvtier.collector.control_receiver import TierState

_CONFIGURED = TierState()


class TierGate:
    """One engine's guardrail state as its scheduler runs it (see module doc).

    ``recorder`` records the engine's moves; ``configured`` is the tier configuration its
    settings describe; ``receiver`` (``None``: no control channel) supplies the state.
    """

    def __init__(self, recorder, configured: str | None, receiver=None, *,
                 clock: Callable[[], float] = time.time):
        self._recorder, self.configured, self._receiver = recorder, configured, receiver
        self._clock = clock
        self.applied = _CONFIGURED
        self.tier_config = configured
        self.fallbacks: dict[str, int] = {}  # requests recomputed instead of loaded, by reason

    def step(self) -> bool:
        """A step boundary: take the receiver's latest state. ``True`` when it changed."""
        state = self._receiver.state if self._receiver is not None else _CONFIGURED
        if state is self.applied:
            return False
        before, self.applied = self.applied, state
        self.tier_config = tier_config_label(self.configured, state.paused)
        now = self._clock()
        for action, pairs in (("pause", state.paused - before.paused),
                              ("resume", before.paused - state.paused)):
            for direction, tier in sorted(pairs):
                self._recorder.record_move(now, action, direction, tier, "engine",
                                           reason=state.reason, tier_config_id=self.tier_config,
                                           command=state.command)
        return True

    @property
    def stores_paused(self) -> bool:
        """Stores into the CPU tier are paused (the cold tier is fed from it: none either)."""
        return ("stores", "cpu") in self.applied.paused

    def recompute_reason(self, external_tokens: int, cold_tokens: int, queue_jobs: int,
                         queue_bytes: int, load_bytes: int) -> str | None:
        """Why this lookup's ``external_tokens`` (``cold_tokens`` of them from the cold tier)
        are recomputed instead of loaded, or ``None`` to load them. ``queue_*``: the load
        jobs and bytes in flight ahead of it; ``load_bytes``: its own."""
        if not external_tokens:
            return None
        state = self.applied
        if ("loads", "cpu") in state.paused or (cold_tokens and ("loads", "cold") in state.paused):
            return self._fell_back("paused")
        costs = state.costs
        if state.act and costs is not None and \
                costs.load_wait_s(queue_jobs + 1, queue_bytes + load_bytes) > costs.recompute_s(external_tokens):
            return self._fell_back("queue")
        return None

    def _fell_back(self, reason: str) -> str:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
        return reason
