"""The load each rollout phase replays: the same trace slice and ramp against an endpoint."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Callable, Sequence

from kvtier.collector.events import RequestRecord
from kvtier.rollout.plan import PhaseTiers


def phase_driver(endpoint: str, trace: Sequence[RequestRecord], load_config, *,
                 progress: Callable[[str], None] = lambda line: None,
                 on_result: Callable = lambda tiers, result: None) -> Callable:
    """A ``run_phase`` for :func:`kvtier.rollout.runner.run_rollout` built on the load probe.

    Every phase sends ``trace`` with ``load_config``'s ramp; the phase's name is stamped on
    records the server does not label itself.
    """
    from kvtier.probes.active.client import stream_completion
    from kvtier.probes.active.load import run_load

    send = functools.partial(stream_completion, endpoint.rstrip("/"))  # send(prompt_ids, max_tokens)

    def run_phase(tiers: PhaseTiers):
        result = run_load(trace, send, replace(load_config, tier_config_id=tiers.config_id), progress=progress)
        on_result(tiers, result)
        return list(result.records), len(result.errors)

    return run_phase
